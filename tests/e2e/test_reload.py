"""Triton reloads of a FastPath model: a failed reload then a good one, repeated, leave the server
serving, and the metrics endpoint holds only the serving stub's series.

Reloading ``text_embedding`` with a bad ``config.pbtxt`` value, then with a good one, twice, kills a
tritonserver whose stubs share metric series ("malloc_consolidate(): unaligned fastbin chunk
detected" / SIGSEGV at the fourth step): two stubs publishing a metric with the same name and labels
share one prometheus-cpp series in Triton 2.51, and the first stub to drop it leaves the others a
dangling pointer (upstream triton-inference-server/server#8663). FastPath labels every
series with the stub's ``pid`` (fastpath.triton.metrics.stub_labels).
"""

from __future__ import annotations

import re
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MODEL_REPOSITORY, start_server, wait_for

pytestmark = pytest.mark.e2e
MODEL = "text_embedding"
KEY = "test-reload-key"
CANCEL = re.compile(r'(key: "cancel_check_after_us" value: \{ string_value: )"[^"]*"')


@pytest.fixture(scope="module")
def reload_server(tmp_path_factory):
    """A server of a copy of text_embedding whose config.pbtxt the test edits; yields (server, config path)."""
    root = tmp_path_factory.mktemp("reload")
    version = root / "repository" / MODEL / "1"
    version.mkdir(parents=True)
    config = version.parent / "config.pbtxt"
    config.write_text((MODEL_REPOSITORY / MODEL / "config.pbtxt").read_text())
    for name in ("model.py", "model.onnx", "tokenizer.json", "manifest.json", "golden.npz"):
        (version / name).symlink_to(MODEL_REPOSITORY / MODEL / "1" / name)
    server = start_server(root, models=(MODEL,), repository=root / "repository", admin_key=KEY)
    try:
        yield server, config
    finally:
        server.stop()
        shutil.rmtree(root / "repository", ignore_errors=True)


def _embed(client, texts):
    array = np.array(texts, dtype=object).reshape(-1, 1)
    tensor = httpclient.InferInput("TEXT", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return client.infer(MODEL, [tensor]).as_numpy("EMBEDDING")


def _series_pids(server) -> set[str]:
    """The ``pid`` label of every fastpath_* series of text_embedding on the metrics endpoint (a stub
    creates its series in ``initialize`` and drops them in ``finalize``: no flush to wait for)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.options.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return set(re.findall(r'^fastpath_\w+\{[^}]*model="text_embedding"[^}]*pid="(\d+)"', text, flags=re.M))


def test_failed_and_good_reloads_in_turn_leave_the_server_serving(reload_server, sentences):
    server, config = reload_server
    shipped = config.read_text()
    texts = sentences[:16]
    headers = {"fastpath-admin-key": KEY}
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    expected = _embed(client, texts)
    serving = _series_pids(server)
    assert len(serving) == 1, serving
    try:
        for step in range(6):  # fail, load, fail, load, fail, load: the crash came at the fourth
            failing = step % 2 == 0
            config.write_text(CANCEL.sub(rf'\1"{-1 if failing else 250_000 + step}"', shipped))
            if failing:
                with pytest.raises(InferenceServerException, match="cancel_check_after_us"):
                    client.load_model(MODEL, headers=headers)
            else:
                client.load_model(MODEL, headers=headers)
            np.testing.assert_allclose(_embed(client, texts), expected, atol=1e-5)
            assert server.poll() is None, f"tritonserver exited with {server.poll()} at step {step}"
            # Triton unloads the replaced stub after load_model returns (~1 s here); its finalize drops its series
            assert wait_for(lambda: len(_series_pids(server)) == 1, timeout_s=20, poll_s=0.2), \
                f"step {step}: series of stubs {_series_pids(server)}; only the serving stub's should remain"
            pids = _series_pids(server)
            assert (pids == serving) == failing, "a failed load keeps the serving stub; a good one replaces it"
            serving = pids
    finally:
        config.write_text(shipped)
    assert client.is_server_live() and client.is_model_ready(MODEL)
