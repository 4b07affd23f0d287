"""benchmarks/perf_analyzer.py: reading perf_analyzer 2.51's own files and writing its input data.

The files under tests/data/perf_analyzer were written by perf_analyzer 2.51.0 against FastPath's text_embedding
(the texts of ``pydoc_sentences()[:500]``): a ``--verbose-csv`` row at concurrency 4 over gRPC, a plain row at
30 requests/s over HTTP, a ``--profile-export-file`` of 3 requests, and the output of a run whose input held a
text that is not UTF-8.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import perf_analyzer as pa  # noqa: E402

DATA = ROOT / "tests" / "data" / "perf_analyzer"


def test_concurrency_csv_gives_microseconds_throughput_and_level():
    """The verbose CSV row: latencies and server times in microseconds as written, req/s = inferences/s / batch."""
    cell = pa.parse_csv((DATA / "concurrency_verbose.csv").read_text())
    assert cell["concurrency"] == 4
    assert cell["texts_per_s"] == pytest.approx(99.7071) and cell["req_per_s"] == pytest.approx(99.7071)
    assert (cell["p50_us"], cell["p90_us"], cell["p95_us"], cell["p99_us"], cell["avg_us"]) == (39798, 58846, 65922, 76771, 39903)
    assert (cell["server_queue_us"], cell["server_compute_input_us"], cell["server_compute_infer_us"],
            cell["server_compute_output_us"]) == (260, 41, 1041, 21)
    assert cell["client_send_us"] == 18 and cell["network_server_us"] == 38515 and cell["client_recv_us"] == 4
    # a batch of 8 entries per request: the same inferences are an eighth as many requests
    assert pa.parse_csv((DATA / "concurrency_verbose.csv").read_text(), batch=8)["req_per_s"] == pytest.approx(99.7071 / 8)


def test_request_rate_csv_without_verbose_columns():
    """A request-rate row names its rate; columns it lacks (Avg latency without --verbose-csv) are absent, not 0."""
    cell = pa.parse_csv((DATA / "request_rate.csv").read_text())
    assert cell["request_rate_per_s"] == 30.0 and "concurrency" not in cell
    assert cell["texts_per_s"] == pytest.approx(29.6337)
    assert cell["p99_us"] == 42788 and cell["server_compute_infer_us"] == 14854
    assert "avg_us" not in cell


def test_csv_without_a_row_is_an_error():
    header = (DATA / "concurrency_verbose.csv").read_text().splitlines()[0]
    with pytest.raises(pa.PerfAnalyzerError, match="Inferences/Second"):
        pa.parse_csv(header + "\n")


def test_export_gives_each_request_times_and_outputs():
    """Every request of the export, sorted by send time: seconds on time.time()'s clock, done after sent, and the
    response's outputs (MODEL_VERSION, a unit-length 384-float EMBEDDING) for a text of the input data."""
    from fastpath.text.corpus import pydoc_sentences

    export = json.loads((DATA / "export.json").read_text())
    requests = pa.parse_export((DATA / "export.json").read_text())
    assert len(requests) == 3 == len(export["experiments"][0]["requests"])
    assert [r.sent_s for r in requests] == sorted(r.sent_s for r in requests)
    first = min(export["experiments"][0]["requests"], key=lambda entry: entry["timestamp"])
    assert requests[0].sent_s == first["timestamp"] / 1e9 and requests[0].done_s == first["response_timestamps"][-1] / 1e9
    assert 1.7e9 < requests[0].sent_s < 2.1e9  # epoch seconds, comparable with time.time()
    texts = set(pydoc_sentences()[:500])
    for request, entry in zip(requests, sorted(export["experiments"][0]["requests"], key=lambda e: e["timestamp"])):
        assert 0 < request.latency_s < 10
        assert request.outputs["MODEL_VERSION"] == 1
        assert np.linalg.norm(request.outputs["EMBEDDING"]) == pytest.approx(1.0, abs=1e-4)
        assert len(request.outputs["EMBEDDING"]) == 384
        assert entry["request_inputs"]["TEXT"] in texts


def test_window_counts_completions_inside_and_latency_by_send_time():
    """Completed = answered inside [start, end]; latencies = every request sent inside, also one answered after end."""
    requests = [pa.Request(0.5, 1.2, {}), pa.Request(1.0, 1.5, {}), pa.Request(1.8, 2.6, {}), pa.Request(2.2, 2.3, {})]
    stats = pa.window(requests, 1.0, 2.0)
    assert stats["completed"] == 2  # done at 1.2 and 1.5
    assert stats["throughput_per_s"] == 2.0 and stats["seconds"] == 1.0
    assert stats["latencies_s"] == pytest.approx([0.5, 0.8])  # sent at 1.0 and 1.8


def test_thread_errors_from_a_run_with_a_failed_request():
    output = (DATA / "failed_requests.txt").read_text()
    errors = pa.thread_errors(output)
    assert len(errors) == 2
    assert all(error.startswith("TEXT[0] is not valid UTF-8: byte 0xff at offset 0") for error in errors)
    assert pa.thread_errors("Request concurrency: 2\n") == []


def test_text_input_data_is_perf_analyzers_json(tmp_path):
    """One entry per text in order, tensor TEXT of shape [1], the text itself as content."""
    texts = ["hello world", "naïve café ☕", ""]
    path = pa.write_input_data(tmp_path / "in.json", pa.text_entries(texts))
    assert json.loads(path.read_text()) == {"data": [{"TEXT": {"content": [text], "shape": [1]}} for text in texts]}


def test_empty_input_data_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no entries"):
        pa.write_input_data(tmp_path / "in.json", [])


@given(st.binary(max_size=300))
def test_bytes_element_is_tritons_length_prefixed_form(data):
    """b64 of a 4-byte little-endian length followed by the bytes, for any bytes (not only UTF-8)."""
    raw = base64.b64decode(pa.bytes_element(data)["b64"])
    assert struct.unpack("<I", raw[:4])[0] == len(data) and raw[4:] == data


def test_image_and_array_entries(tmp_path):
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    (array,) = pa.array_entries([image], "IMAGE")
    assert array["IMAGE"]["shape"] == [2, 3, 3]
    assert np.frombuffer(base64.b64decode(array["IMAGE"]["b64"]), dtype=np.uint8).reshape(2, 3, 3).tolist() == image.tolist()
    (encoded,) = pa.image_entries([b"\x89PNG\r\n"])
    assert encoded["IMAGE_BYTES"]["shape"] == [1]
    assert base64.b64decode(encoded["IMAGE_BYTES"]["b64"]) == struct.pack("<I", 6) + b"\x89PNG\r\n"


@pytest.mark.parametrize("kwargs, message", [
    ({"protocol": "udp", "concurrency": 1}, "protocol 'udp'"),
    ({}, "give concurrency or request_rate_per_s"),
    ({"concurrency": 2, "request_rate_per_s": 5.0}, "not both"),
    ({"concurrency": 0}, "concurrency 0"),
    ({"request_rate_per_s": 0.0}, "request_rate_per_s 0.0"),
    ({"concurrency": 1, "batch": 0}, "batch 0"),
])
def test_load_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pa.Load(model="m", url="127.0.0.1:1", data=Path("in.json"), **kwargs)


def test_load_command_line():
    analyzer = pa.PerfAnalyzer(Path("/x/perf_analyzer"), None)
    closed = pa.Load(model="text_embedding", url="h:1", data=Path("d.json"), protocol="http", concurrency=8, batch=2).argv(analyzer)
    assert closed[:9] == ["/x/perf_analyzer", "-m", "text_embedding", "-u", "h:1", "-i", "http", "--input-data", "d.json"]
    assert closed[closed.index("-b") + 1] == "2" and closed[closed.index("--concurrency-range") + 1] == "8:8"
    rate = pa.Load(model="m", url="h:1", data=Path("d.json"), request_rate_per_s=50.0).argv(analyzer)
    assert rate[rate.index("--request-rate-range") + 1] == "50.0:50.0" and "--concurrency-range" not in rate


def test_library_dir_leads_ld_library_path(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/a:/b")
    assert pa.PerfAnalyzer(Path("pa"), Path("/libs")).env()["LD_LIBRARY_PATH"] == "/libs:/a:/b"


def test_find_names_a_missing_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("PERF_ANALYZER", str(tmp_path / "nowhere" / "perf_analyzer"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pa.PerfAnalyzerError, match="make perf-analyzer"):
        pa.find()


def test_the_installed_perf_analyzer_command_runs_without_ld_library_path():
    """Invariant: `perf_analyzer` in the environment's bin runs as a user types it (make setup's wrapper puts its two
    libraries on LD_LIBRARY_PATH); the wheel's binary alone failed with 'libb64.so.0d: cannot open shared object file'."""
    import os
    import subprocess

    command = Path(sys.prefix) / "bin" / "perf_analyzer"
    if not command.exists():
        pytest.skip(f"{command} is missing: tritonclient 2.51.0 is not installed in this environment (make setup)")
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    done = subprocess.run([str(command), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Perf Analyzer Version 2.51.0" in done.stdout + done.stderr, done.stdout + done.stderr
