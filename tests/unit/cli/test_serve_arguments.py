"""`fastpath serve` refuses arguments tritonserver would trip over, before starting it, each with one line that
names the argument, the value and what is expected (never a traceback, never Triton's usage dump)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastpath.cli import main as cli
from fastpath.cli import serve
from fastpath.errors import ServerError
from fastpath.server.devices import CudaReport
from fastpath.server.preflight import check_ports_free


def parse(*argv: str):
    return cli.build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (["--http-port", "70000"], "argument --http-port: '70000' is not a port number (an integer in 1-65535)"),
    (["--grpc-port", "0"], "argument --grpc-port: '0' is not a port number"),
    (["--metrics-port", "80o2"], "argument --metrics-port: '80o2' is not a port number"),
    (["--ready-timeout-s", "-1"], "argument --ready-timeout-s: '-1' is not a number of seconds > 0"),
    (["--ready-timeout-s", "nan"], "argument --ready-timeout-s: 'nan' is not a number of seconds > 0"),
])
def test_out_of_range_ports_and_timeouts_are_argument_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_model_the_repository_lacks_is_refused_naming_the_ones_it_holds():
    with pytest.raises(ServerError, match=r"--model nope: not in the model repository .* which holds .*text_embedding"):
        serve.serve_options(parse("--model", "text_embedding", "--model", "nope"), "key", probe=lambda: CudaReport(()))


@pytest.mark.parametrize(("flag", "hint"), [("--http-port=18203", "use fastpath serve's flag of that name"),
                                           ("--grpc-address=127.0.0.2", "use --host"),
                                           ("--model-control-mode=poll", "its supervision, swaps and admin key need it"),
                                           ("--load-model text_detection", "use --model")])
def test_a_triton_arg_of_a_flag_fastpath_sets_is_refused_naming_what_to_use(flag, hint):
    """Before, --triton-arg=--http-port=18203 started Triton on 18203 while fastpath serve waited on its own port,
    silently, until its ready timeout. Invariant: such a flag is refused before anything starts, naming it and the
    option that sets it; other Triton flags pass through."""
    with pytest.raises(ServerError, match=f"--triton-arg={flag}: fastpath serve sets {flag.split('=')[0].split()[0]} itself "
                                          rf"\({hint}\)"):
        serve.serve_options(parse(f"--triton-arg={flag}", "--model", "text_embedding"), "key", probe=lambda: CudaReport(()))
    options = serve.serve_options(parse("--triton-arg=--metrics-config=summary_latencies=true", "--model", "text_embedding"),
                                  "key", probe=lambda: CudaReport(()))
    assert options.extra_args == ("--metrics-config=summary_latencies=true",)


def test_an_empty_host_is_refused():
    """Before, --host "" loaded every model and then failed with Triton's misleading 'Socket :18201 already in use'."""
    with pytest.raises(ServerError, match="--host is empty; give the address to bind to"):
        serve.serve_options(parse("--host", "", "--model", "text_embedding"), "key", probe=lambda: CudaReport(()))


def test_one_port_for_two_protocols_is_refused():
    with pytest.raises(ServerError, match="HTTP, gRPC and metrics need a port each; got --http-port 18100, --grpc-port 18100"):
        serve.serve_options(parse("--http-port", "18100", "--grpc-port", "18100", "--metrics-port", "18102"), "key",
                            probe=lambda: CudaReport(()))


@pytest.mark.parametrize("host", ["256.1.1.1", "no-such-host.invalid"])
def test_a_host_that_is_no_address_of_this_machine_is_named_as_such(host):
    """Before, an unresolvable --host was reported as the HTTP port being in use."""
    with pytest.raises(ServerError, match=rf"--host {host} is not an address of this machine") as info:
        check_ports_free(host, {"HTTP": 18999})
    assert "in use" not in str(info.value)


def test_malloc_comes_from_the_flag_else_fastpath_malloc_else_auto(monkeypatch):
    """Invariant: --malloc wins, FASTPATH_MALLOC is the default, auto when neither; the choice reaches ServerOptions."""
    monkeypatch.delenv("FASTPATH_MALLOC", raising=False)
    options = serve.serve_options(parse("--model", "text_embedding"), "key", probe=lambda: CudaReport(()))
    assert options.malloc == "auto"
    monkeypatch.setenv("FASTPATH_MALLOC", "glibc")
    assert parse().malloc == "glibc"
    assert serve.serve_options(parse("--malloc", "tcmalloc", "--model", "text_embedding"), "key",
                               probe=lambda: CudaReport(())).malloc == "tcmalloc"
    monkeypatch.setenv("FASTPATH_MALLOC", "")  # set but empty (a compose file's blank value) counts as unset
    assert parse().malloc == "auto"


@pytest.mark.parametrize("command", [[], ["serve"], ["build"], ["bench"], ["swap"], ["rollback"], ["status"]])
def test_help_is_plain_text_without_docstring_markup(capsys, command):
    """Invariant: every command's --help shows plain text: no reST role (:func:`...`) and no double backquotes
    from the docstrings it is built from."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*command, "--help"])
    text = capsys.readouterr().out
    assert "usage: fastpath" in text
    assert "``" not in text and ":func:" not in text and ":class:" not in text, text


def test_a_refused_start_leaves_no_state_directory(tmp_path, monkeypatch):
    """Invariant: a start refused before tritonserver runs (here: tcmalloc asked for, none installed) removes the
    temporary state directory it made; nothing named fastpath-state-* is left in the temporary folder."""
    import tempfile

    from fastpath.server import malloc
    from fastpath.server.process import ServerOptions, TritonServer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(malloc, "search_paths", lambda: [tmp_path / "nothing"])
    monkeypatch.delenv("FASTPATH_TCMALLOC", raising=False)
    server = TritonServer(ServerOptions(model_repository=tmp_path, http_port=1, grpc_port=2, metrics_port=3,
                                        host="127.0.0.1", malloc="tcmalloc"))
    with pytest.raises(ServerError, match="malloc tcmalloc: none of"):
        server.start()
    assert not list(tmp_path.glob("fastpath-state-*"))


def test_an_unknown_malloc_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--malloc", "jemalloc")
    assert info.value.code == 2 and "argument --malloc: invalid choice: 'jemalloc'" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a_file", "a_file/below"])
def test_a_state_directory_that_cannot_be_made_is_a_server_error_naming_it(tmp_path, where):
    """Invariant: a --state-dir (or FASTPATH_STATE_DIR) that is a file, or lies below one, refuses the start with a
    ServerError naming the path and what is expected, before tritonserver runs (was a FileExistsError traceback)."""
    from fastpath.server.preflight import check_state_dir

    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(ServerError, match=rf"state directory {tmp_path / where}: cannot create it .*expected a writable directory"):
        check_state_dir(tmp_path / where)


def test_a_state_directory_is_made_when_missing(tmp_path):
    from fastpath.server.preflight import check_state_dir

    check_state_dir(tmp_path / "new" / "state")
    assert (tmp_path / "new" / "state").is_dir()


def test_a_version_record_directory_that_cannot_be_made_refuses_the_start_naming_the_variable(tmp_path, monkeypatch):
    """Invariant: a FASTPATH_VERSION_STATE_DIR that cannot be made refuses the start before tritonserver runs, naming
    the variable (every live swap writes its record there, and was refused only at the first swap), and leaves no
    temporary state directory; one that can be made is made, and an empty value (records in the repository) is none."""
    import tempfile

    from fastpath.server.preflight import check_version_state_dir
    from fastpath.server.process import ServerOptions, TritonServer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "a_file").write_text("not a directory")
    monkeypatch.setenv("FASTPATH_VERSION_STATE_DIR", str(tmp_path / "a_file" / "versions"))
    server = TritonServer(ServerOptions(model_repository=tmp_path, http_port=1, grpc_port=2, metrics_port=3, host="127.0.0.1"))
    with pytest.raises(ServerError, match=rf"serving-version record directory {tmp_path / 'a_file' / 'versions'}: cannot "
                                          r"create it .*\(FASTPATH_VERSION_STATE_DIR\)"):
        server.start()
    assert not list(tmp_path.glob("fastpath-state-*"))
    check_version_state_dir(tmp_path / "new" / "versions")
    assert (tmp_path / "new" / "versions").is_dir()
    check_version_state_dir(None)


def test_a_short_admin_key_is_taken_with_a_warning_naming_the_minimum(monkeypatch, caplog):
    """Invariant: `fastpath serve` serves with any FASTPATH_ADMIN_KEY it is given, but one shorter than
    MIN_ADMIN_KEY_CHARS (the container entrypoint's minimum) logs a warning; a long enough key logs none."""
    import logging

    from fastpath.cli.common import MIN_ADMIN_KEY_CHARS

    monkeypatch.setenv("FASTPATH_ADMIN_KEY", "abc")
    with caplog.at_level(logging.WARNING):
        assert serve._admin_key() == ("abc", False)
    assert f"FASTPATH_ADMIN_KEY has 3 characters, fewer than {MIN_ADMIN_KEY_CHARS}" in caplog.text
    caplog.clear()
    monkeypatch.setenv("FASTPATH_ADMIN_KEY", "k" * MIN_ADMIN_KEY_CHARS)
    with caplog.at_level(logging.WARNING):
        serve._admin_key()
    assert "FASTPATH_ADMIN_KEY has" not in caplog.text


def test_a_dangling_serving_version_link_is_removed_and_other_dangling_links_are_refused(tmp_path):
    """Triton's poll fails on a model directory holding a link to nothing. The serving-version record is
    FastPath's, and a damaged record never stops the server: a dangling record link is removed (the model starts
    on its loaded version) and nothing else is touched. Any other dangling link is the operator's: refused,
    naming the directory, the link and its target. A link to an existing file is left alone."""
    from fastpath.server.preflight import check_model_dirs

    model = tmp_path / "text_embedding"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text("name: 'text_embedding'\n")
    (model / "serving_version.json").symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "real.txt").write_text("x")
    (model / "notes.txt").symlink_to(tmp_path / "real.txt")
    assert check_model_dirs(tmp_path, ["text_embedding", "fastpath_admin"]) == [model / "serving_version.json"]
    assert not (model / "serving_version.json").is_symlink() and (model / "notes.txt").read_text() == "x"
    assert (model / "config.pbtxt").exists() and (model / "1").is_dir()

    (model / "labels.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(ServerError) as info:
        check_model_dirs(tmp_path, ["text_embedding"])
    assert str(info.value) == (f"model directory {model}: labels.txt is a symbolic link to {tmp_path / 'gone.txt'}, which does "
                               "not exist; Triton cannot poll a model directory holding it: remove the link or point it at a file")
    assert (model / "labels.txt").is_symlink()


def test_restarts_are_allowed_up_to_the_limit_within_the_window():
    """restart_allowed counts restarts in a sliding 600 s window: the limit's worth pass, the next is refused,
    one falls out of the window and another passes; a limit of 0 never restarts."""
    from fastpath.cli.serve import restart_allowed

    restarts: list[float] = []
    assert restart_allowed(restarts, 0.0, 2) and restart_allowed(restarts, 100.0, 2)
    assert not restart_allowed(restarts, 200.0, 2) and restarts == [0.0, 100.0]
    assert restart_allowed(restarts, 600.0, 2) and restarts == [100.0, 600.0]
    assert not restart_allowed([], 0.0, 0)
    assert parse("--max-restarts", "0").max_restarts == 0 and parse().max_restarts == 3


def test_a_negative_max_restarts_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--max-restarts", "-1")
    assert info.value.code == 2 and "argument --max-restarts: must be >= 0 (restarts in 10 minutes), got '-1'" in capsys.readouterr().err


def test_a_bad_port_variable_stops_only_a_serve_that_uses_it_and_names_the_variable(monkeypatch, capsys):
    """Before, METRICS_PORT=abc made every command exit at parser build, `fastpath --help` and `build` included, and
    beat an explicit --metrics-port. Invariants: the parser builds; an explicit option wins; a serve that falls
    back on the variable is an argument error naming the value and the variable."""
    monkeypatch.setenv("METRICS_PORT", "abc")
    assert cli.build_parser().parse_args(["build", "--verify"]).command == "build"
    assert parse("--metrics-port", "18202").metrics_port == 18202
    with pytest.raises(SystemExit) as info:
        parse()
    assert info.value.code == 2
    assert "argument --metrics-port: 'abc' is not a port number (an integer in 1-65535) (from environment variable METRICS_PORT)" in capsys.readouterr().err
    monkeypatch.setenv("METRICS_PORT", "18302")
    assert parse().metrics_port == 18302


def test_a_state_directory_even_root_cannot_write_is_refused():
    """Invariant: the state-directory check writes a file rather than asking os.access, which answers yes to root on a
    read-only file system: /sys/kernel (sysfs) is refused naming the variable instead of failing at the first swap."""
    from fastpath.server.preflight import check_version_state_dir

    if not Path("/sys/kernel").is_dir():
        pytest.skip("no /sys/kernel on this machine")
    with pytest.raises(ServerError, match=r"serving-version record directory /sys/kernel is not writable by this user .*"
                                          r"\(FASTPATH_VERSION_STATE_DIR\)"):
        check_version_state_dir(Path("/sys/kernel"))
