"""`fastpath bench`: arguments that cannot make a load are refused up front (a bench that cannot reach
the model ends with one line and exit 1: tests/e2e/test_client.py)."""

from __future__ import annotations

import pytest

from fastpath.cli import main as cli
from fastpath_client.loadgen import LoadSettings


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--concurrency", "0", "must be >= 1 (concurrent requests, whole numbers), got '0'"),
    ("--concurrency", "-2", "must be >= 1 (concurrent requests, whole numbers), got '-2'"),
    ("--concurrency", "1,0,8", "must be >= 1 (concurrent requests, whole numbers), got '0' in '1,0,8'"),
    ("--concurrency", "1.5", "expected concurrent requests, whole numbers, got '1.5'"),
    ("--concurrency", ",", "expected a comma-separated list of concurrent requests, whole numbers without empty items, got ','"),
    ("--concurrency", "1,,2", "expected a comma-separated list of concurrent requests, whole numbers without empty items, got '1,,2'"),
    ("--request-rate", "10,", "expected a comma-separated list of requests per second without empty items, got '10,'"),
    ("--metrics-url", "foo", "expected HOST:PORT of Triton's metrics port (its default 8002) or 'none', got 'foo'"),
    ("--request-rate", "0", "must be > 0 (requests per second), got '0'"),
    ("--request-rate", "-1.5", "must be > 0 (requests per second), got '-1.5'"),
    ("--request-rate", "nan", "must be > 0 (requests per second), got 'nan'"),
    ("--request-rate", "inf", "must be > 0 (requests per second), got 'inf'"),
    ("--duration-s", "0", "must be > 0 (seconds), got '0'"),
    ("--duration-s", "-3", "must be > 0 (seconds), got '-3'"),
    ("--warmup-s", "-1", "must be >= 0 (seconds), got '-1'"),
    ("--timeout-s", "0", "must be > 0 (seconds), got '0'"),
    ("--batch-size", "0", "must be >= 1 (items per request), got '0'"),
    ("--max-windows", "0", "must be >= 1 (windows), got '0'"),
    ("--stability-pct", "0", "must be > 0 (percent), got '0'"),
])
def test_arguments_that_cannot_make_a_load_are_refused_naming_option_and_value(option, value, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["bench", option, value])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"fastpath bench: error: argument {option}: {message}"


def test_valid_arguments_still_parse():
    args = cli.build_parser().parse_args(["bench", "--request-rate", "0.5,20", "--warmup-s", "0", "--duration-s", "1.5"])
    assert (args.request_rate, args.warmup_s, args.duration_s) == ([0.5, 20.0], 0.0, 1.5)
    assert cli.build_parser().parse_args(["bench", "--concurrency", "1, 8,32"]).concurrency == [1, 8, 32]
    for metrics_url in ("none", "127.0.0.1:8002"):
        assert cli.build_parser().parse_args(["bench", "--metrics-url", metrics_url]).metrics_url == metrics_url


@pytest.mark.parametrize(("fields", "message"), [
    ({"concurrency": 0}, "concurrency must be >= 1 (concurrent requests), got 0"),
    ({"request_rate": 0.0}, "request_rate must be > 0 requests/s, got 0.0"),
    ({"concurrency": 1, "window_s": 0.0}, "window_s must be > 0 s, got 0.0"),
    ({"concurrency": 1, "timeout_s": -1.0}, "timeout_s must be > 0 s, got -1.0"),
])
def test_load_settings_refuse_zero_concurrency_and_rate(fields, message):
    with pytest.raises(ValueError) as info:
        LoadSettings(model="m", **fields)
    assert str(info.value) == message


@pytest.mark.parametrize("out", ["/proc/fastpath-bench", "{file}"])
def test_an_output_directory_that_cannot_be_written_is_refused_before_the_sweep(tmp_path, capsys, out):
    """The results of a sweep that ran for minutes were lost to a traceback when --out could not be written;
    the directory is now made and checked first (exit 1, one line, and no server was needed to find out)."""
    existing_file = tmp_path / "results.json"
    existing_file.write_text("{}")
    out = out.format(file=existing_file)
    assert cli.main(["bench", "--model", "text_embedding", "--url", "127.0.0.1:9", "--out", out]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fastpath bench: --out {out}: cannot create it (") and err.count("\n") == 1


def test_a_batch_size_above_the_models_max_batch_size_is_refused_before_any_request():
    """Triton refuses a request of more items than max_batch_size, so such a sweep failed every request."""
    from fastpath.cli.bench import input_pool
    from fastpath.errors import BenchError
    from fastpath_client.tensors import model_spec

    spec = model_spec({"name": "text_embedding", "max_batch_size": 64,
                       "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
                       "output": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [384]}]})
    with pytest.raises(BenchError, match=r"--batch-size 65: model text_embedding takes at most 64 items per request"):
        input_pool(spec, 65, {})
    assert len(input_pool(spec, 64, {})[0]["TEXT"]) == 64


def test_a_fleet_command_naming_a_replica_twice_is_refused_before_any_is_touched(capsys):
    """`fastpath swap --url a,a` swapped the same replica twice (a rollback twice would undo itself): refused, exit 1,
    naming the address, before any request (nothing listens on the port)."""
    assert cli.main(["swap", "text_embedding", "2", "--url", "127.0.0.1:1,127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fastpath swap: replica 127.0.0.1:1 is named more than once; list each replica once"]
    assert cli.main(["rollback", "text_embedding", "--url", "127.0.0.1:1,localhost:1"]) == 1  # one server, two spellings
    assert "replicas 127.0.0.1:1 and localhost:1 are one" in capsys.readouterr().err


def test_ctrl_c_before_a_command_handles_it_is_one_line_and_exit_130(monkeypatch, capsys):
    """Invariant: a KeyboardInterrupt out of a command (Ctrl-C while it still imports, before its own signal
    handling) ends the CLI with exit 130 and one line naming the command, not a traceback."""
    from fastpath.cli import admin

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(admin, "_run", interrupted)
    assert cli.main(["status", "text_embedding", "--url", "127.0.0.1:1"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["fastpath status: interrupted"]
