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
    assert server["requests"] > 0 and server["inferences"] >= server["requests"]
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
