"""`fastpath bench` on a short window against a real tritonserver: valid JSON and a PNG."""

from __future__ import annotations

import json

import pytest

from fastpath.cli.main import main

pytestmark = pytest.mark.e2e


def _bench(tmp_path, url, protocol, *mode):
    """Run `fastpath bench`; ``url`` None leaves --url out (the default from the environment)."""
    argv = ["bench", "--model", "text_embedding", *mode, "--duration-s", "1.5", "--warmup-s", "0.5", "--max-windows", "3",
            *(["--url", url] if url else []), "--protocol", protocol, "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    stem = tmp_path / f"bench_text_embedding_{protocol}"
    report = json.loads(stem.with_suffix(".json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    png = stem.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    return report


def _check_result(result):
    latency, server = result["latency_ms"], result["server"]
    assert result["errors"] == 0 and result["requests"] > 0 and result["throughput_per_s"] > 0
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert len(result["windows"]) == 3 and isinstance(result["stable"], bool)
    # Triton counts a request's success and its inferences at different moments, and the snapshots are taken under
    # load: the two counts may differ by the requests in flight at either boundary (one text per request here; at
    # the 5 requests/s of the request-rate test a few at most).
    in_flight = 2 * (result["concurrency"] or 4)
    assert server["requests"] > 0 and abs(server["inferences"] - server["requests"]) <= in_flight
    assert all(server[f"{phase}_us"] > 0 for phase in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert server["success_us"] <= latency["avg"] * 1e3 * 1.5  # the server's share fits in what the client saw


def test_concurrency_sweep_over_http(triton_server, tmp_path):
    report = _bench(tmp_path, triton_server.http_url, "http", "--concurrency", "1,4")
    assert [r["label"] for r in report["results"]] == ["c=1", "c=4"]
    assert report["inputs"] == {"TEXT": ["BYTES", [1]]} and report["settings"]["window_s"] == 0.5
    for result in report["results"]:
        _check_result(result)


def test_request_rate_over_grpc_to_the_server_the_environment_names(triton_server, tmp_path, monkeypatch):
    """Without --url, bench goes to $HOST:$GRPC_PORT, the variables `make serve` reads."""
    host, port = triton_server.grpc_url.rsplit(":", 1)
    monkeypatch.setenv("HOST", host)
    monkeypatch.setenv("GRPC_PORT", port)
    monkeypatch.setenv("HTTP_PORT", "1")  # the other protocol's port is not used
    report = _bench(tmp_path, None, "grpc", "--request-rate", "5", "--poisson")
    assert report["url"] == triton_server.grpc_url
    (result,) = report["results"]
    assert result["label"] == "r=5/s" and result["poisson"] is True
    _check_result(result)


def test_split_takes_fastpath_time_after_execute_from_its_metrics(triton_server, tmp_path):
    """At concurrency 8 FastPath answers from its scheduler after execute() returned, which Triton's
    statistics do not see; the bench reads FastPath's queued-path counters from the metrics port over the
    same windows. FastPath's queue wait and batch run are positive; the rest (delivery + network + client) is
    the client's average less Triton's total and FastPath's parts, floored at 0, and less than the server's
    share. The server's counters are read at the window's edges while up to 8 requests are in flight, so
    their per-request average may exceed the client's by up to 8 of the window's requests (the floor)."""
    from fastpath_client.report import REST, time_split_ms

    metrics = f"127.0.0.1:{triton_server.options.metrics_port}"
    report = _bench(tmp_path, triton_server.http_url, "http", "--concurrency", "8", "--metrics-url", metrics)
    (result,) = report["results"]
    _check_result(result)
    assert report["fastpath_metrics"] is True
    server = result["server"]
    assert server["fastpath_queue_us"] > 0 and server["fastpath_batch_run_us"] > 0
    split = time_split_ms(result)
    server_ms = (server["success_us"] + server["fastpath_queue_us"] + server["fastpath_batch_run_us"]) / 1e3
    client_ms = result["latency_ms"]["avg"]
    assert split[REST] == pytest.approx(max(client_ms - server_ms, 0.0), abs=1e-9)
    assert server_ms <= client_ms * 1.15, (server_ms, client_ms)
    assert split[REST] < server_ms, split
    print({k: round(v, 2) for k, v in split.items()})


def test_an_unanswered_metrics_port_leaves_triton_split_only(triton_server, tmp_path, caplog):
    """--metrics-url pointing at a closed port: the bench runs, warns once, and reports Triton's phases only."""
    from tests.conftest import free_ports

    (closed,) = free_ports(1)
    report = _bench(tmp_path, triton_server.http_url, "http", "--concurrency", "1", "--metrics-url", f"127.0.0.1:{closed}")
    assert report["fastpath_metrics"] is False and "fastpath_queue_us" not in report["results"][0]["server"]
    assert "no FastPath metrics at 127.0.0.1" in caplog.text
