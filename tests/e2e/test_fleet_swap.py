"""Rolling swaps across replicas and the `fastpath swap/rollback/status` CLI.

Three real tritonserver processes on loopback, each with its own model repository; replica 2's
version 2 fails its golden check, so a fleet swap through it must leave every replica on version 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from fastpath_client import Client
from fastpath_client.fleet import rolling_swap
from tests.conftest import free_ports, start_server
from tests.e2e.swap_support import MODELS, LoadStreams, make_swap_repository

pytestmark = pytest.mark.e2e
KEY = "fleet-admin-key"
V2 = MODELS / "text_embedding" / "2"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    servers = []
    try:
        for index in range(3):
            root = tmp_path_factory.mktemp(f"replica{index}")
            repository = make_swap_repository(root, {1: MODELS / "text_embedding" / "1", 2: V2 if (V2 / "manifest.json").exists() else MODELS / "text_embedding" / "1"})
            if index == 1:  # replica 2: a version 2 whose golden outputs no longer match
                from fastpath.manifest import read_manifest, write_manifest
                from fastpath.models.text_embedding.golden import write_golden

                version_dir = repository / "text_embedding" / "2"
                with np.load(version_dir / "golden.npz") as golden:
                    texts, embeddings = golden["texts"], golden["embeddings"]
                (version_dir / "golden.npz").unlink()
                write_golden(version_dir, tuple(texts), -embeddings)
                manifest = read_manifest(version_dir)
                write_manifest(version_dir, manifest.pop("files"), manifest)
            servers.append(start_server(root, repository=repository, admin_key=KEY))
        yield servers
    finally:
        for server in servers:
            server.stop()


def _versions(servers):
    return [Client(s.http_url, admin_key=KEY).status("text_embedding")["active_version"] for s in servers]


def _factory(url):
    return Client(url, protocol="http", admin_key=KEY)


def test_failure_on_replica_2_leaves_all_on_the_old_version(fleet, sentences):
    with LoadStreams(fleet[0].http_url, fleet[0].grpc_url, sentences[:200], count=4) as load:
        result = rolling_swap([s.http_url for s in fleet], "text_embedding", 2, client_factory=_factory)
    assert not result.ok
    assert result.failed[0] == fleet[1].http_url and "golden check failed" in result.failed[1]
    assert result.swapped == [fleet[0].http_url] and result.rolled_back == [fleet[0].http_url]
    assert _versions(fleet) == [1, 1, 1]
    assert [r for r in load.snapshot() if r[5]] == []


def test_rolling_swap_under_load_moves_every_replica(fleet, sentences):
    healthy = [fleet[0], fleet[2]]
    loads = [LoadStreams(s.http_url, s.grpc_url, sentences[:200], count=4) for s in healthy]
    for load in loads:
        load.__enter__()
    try:
        time.sleep(1.0)
        result = rolling_swap([s.http_url for s in healthy], "text_embedding", 2, client_factory=_factory)
        time.sleep(1.0)
    finally:
        for load in loads:
            load.__exit__(None, None, None)
    assert result.ok and result.swapped == [s.http_url for s in healthy]
    assert _versions(healthy) == [2, 2]
    records = [r for load in loads for r in load.snapshot()]
    assert [r[5] for r in records if r[5]] == [] and {r[4][0] for r in records} == {1, 2}
    rolling_swap([s.http_url for s in healthy], "text_embedding", 1, client_factory=_factory)


def test_a_replica_that_is_down_stops_the_roll_before_any_replica_moves(fleet):
    """Every replica is checked before the first swap: with the second one down, the first stays on its
    version (before, it was swapped, then waited for the down one, then swapped back)."""
    down = f"127.0.0.1:{free_ports(1)[0]}"
    lines: list[str] = []
    result = rolling_swap([fleet[0].http_url, down], "text_embedding", 2, client_factory=_factory, ready_timeout_s=2,
                          on_progress=lines.append)
    assert not result.ok and result.swapped == [] and result.rolled_back == [] and result.failed[0] == down
    assert _versions([fleet[0]]) == [1]
    assert not any("swapping" in line for line in lines) and lines[-1].startswith(f"{down}: not ready, nothing swapped")


def test_an_interrupt_during_the_roll_swaps_back_what_moved_and_is_raised_again(fleet):
    """Ctrl-C (KeyboardInterrupt; the CLI turns SIGTERM into one) after the first replica moved: the roll swaps
    it back before the interrupt propagates, so the fleet is not left split between versions."""
    healthy = [fleet[0], fleet[2]]
    lines: list[str] = []

    def progress(line):
        lines.append(line)
        if line == f"{healthy[0].http_url}: serving version 2":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rolling_swap([s.http_url for s in healthy], "text_embedding", 2, client_factory=_factory, on_progress=progress)
    assert _versions(healthy) == [1, 1]
    assert f"{healthy[0].http_url}: rolling back to version 1" in lines
    assert f"{healthy[1].http_url}: swapping to version 2" not in lines


def test_cli_swap_status_rollback(fleet):
    env = dict(os.environ, FASTPATH_ADMIN_KEY=KEY)
    url = fleet[2].http_url

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "fastpath", *args], env=env, capture_output=True, text=True, timeout=300)

    swapped = cli("swap", "text_embedding", "2", "--url", url)
    assert swapped.returncode == 0, swapped.stderr
    assert json.loads(swapped.stdout)["active_version"] == 2
    status = cli("status", "text_embedding", "--url", fleet[2].grpc_url, "--protocol", "grpc")
    (instance,) = json.loads(status.stdout)["instances"].values()  # keyed <instance>.pid<pid>
    assert instance["instance"].startswith("text_embedding_0_0.pid") and instance["previous_version"] == 1
    rolled = cli("rollback", "text_embedding", "--url", url)
    assert rolled.returncode == 0 and json.loads(rolled.stdout)["active_version"] == 1
    refused = subprocess.run([sys.executable, "-m", "fastpath", "swap", "text_embedding", "2", "--url", url],
                             env={**env, "FASTPATH_ADMIN_KEY": "wrong"}, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "admin key" in refused.stderr


def test_cli_fleet_rollback_with_a_replica_down_rolls_back_nothing(fleet):
    """`fastpath rollback --url A,DOWN` reads every replica's status before rolling any back: with the second
    replica down it exits 1 naming it and "nothing rolled back", and A stays on the version it was swapped to
    (before, A was rolled back and only the connection error was printed); each replica's check is a line on stderr."""
    env = dict(os.environ, FASTPATH_ADMIN_KEY=KEY)
    url, down = fleet[2].http_url, f"127.0.0.1:{free_ports(1)[0]}"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "fastpath", *args], env=env, capture_output=True, text=True, timeout=300)

    assert cli("swap", "text_embedding", "2", "--url", url).returncode == 0
    try:
        refused = cli("rollback", "text_embedding", "--url", f"{url},{down}")
        assert refused.returncode == 1 and f"{down}: " in refused.stderr and "nothing rolled back" in refused.stderr
        assert f"fastpath rollback: {url}: ready, serving version 2" in refused.stderr.splitlines()  # each step on stderr
        assert _versions([fleet[2]]) == [2]
    finally:
        cli("swap", "text_embedding", "1", "--url", url)
    assert _versions([fleet[2]]) == [1]


def test_cli_fleet_rollback_rolls_each_replica_back_and_reports_each_step(fleet):
    """`fastpath rollback --url A,B` after a rolling swap: both back on version 1, exit 0, stdout the replies by
    url, and stderr each replica's check, then its roll back and the version it serves after, in order."""
    env = dict(os.environ, FASTPATH_ADMIN_KEY=KEY)
    healthy = [fleet[0], fleet[2]]
    urls = [s.http_url for s in healthy]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "fastpath", *args], env=env, capture_output=True, text=True, timeout=300)

    assert cli("swap", "text_embedding", "2", "--url", ",".join(urls)).returncode == 0
    try:
        rolled = cli("rollback", "text_embedding", "--url", ",".join(urls))
        assert rolled.returncode == 0, rolled.stderr
        assert {url: reply["active_version"] for url, reply in json.loads(rolled.stdout).items()} == dict.fromkeys(urls, 1)
        steps = [line for line in rolled.stderr.splitlines() if line.startswith("fastpath rollback: ")]
        assert steps == [f"fastpath rollback: {urls[0]}: ready, serving version 2", f"fastpath rollback: {urls[1]}: ready, serving version 2",
                         f"fastpath rollback: {urls[0]}: rolling back", f"fastpath rollback: {urls[0]}: serving version 1",
                         f"fastpath rollback: {urls[1]}: rolling back", f"fastpath rollback: {urls[1]}: serving version 1"]
    finally:
        cli("swap", "text_embedding", "1", "--url", ",".join(urls))
    assert _versions(healthy) == [1, 1]
