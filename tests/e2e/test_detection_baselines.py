"""The benchmarks' text-detection baseline (``sync_detection``: text_detection's pipeline without the scheduler,
benchmarks/models/detection_baseline.py) served beside text_detection: its figures are only a baseline while it
gives text_detection's answers, and it reads the inputs through text_detection's own checks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from fastpath.artifacts.detection import build_text_detection, text_detection_present
from tests.conftest import MODEL_REPOSITORY, start_server
from tests.unit.models.text_detection.reference import png_bytes, skimage_rgb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from text_detection_cpu import build_repository  # noqa: E402

pytestmark = pytest.mark.e2e
OUTPUTS = ("BOXES", "SCORES", "BOX_COUNTS")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not text_detection_present(MODEL_REPOSITORY):
        build_text_detection(MODEL_REPOSITORY)
    root = tmp_path_factory.mktemp("detection_baselines")
    server = start_server(root, models=("text_detection", "sync_detection"), repository=build_repository(root))
    try:
        yield server
    finally:
        server.stop()


def _detect(server, model: str, name: str, array: np.ndarray) -> tuple[np.ndarray, ...]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if name == "IMAGE_BYTES" else "UINT8")
        tensor.set_data_from_numpy(array)
        result = client.infer(model, [tensor])
        return tuple(result.as_numpy(output) for output in OUTPUTS)
    finally:
        client.close()


def test_the_sync_baseline_answers_as_text_detection_does(server):
    """Invariants: for a photo as IMAGE (uint8 [1, H, W, 3]) and as IMAGE_BYTES (PNG), sync_detection's boxes,
    scores and counts equal text_detection's (one pipeline: same decode, resize, engine and DB post-processing),
    and a request wrong in itself gets the same 400 naming the element from both."""
    page = skimage_rgb("page.png")
    rgb = np.stack([page] * 3, axis=-1) if page.ndim == 2 else page
    for name, array in (("IMAGE", rgb[np.newaxis]), ("IMAGE_BYTES", np.array([png_bytes(page)], dtype=np.object_))):
        fastpath, baseline = _detect(server, "text_detection", name, array), _detect(server, "sync_detection", name, array)
        assert fastpath[2].tolist() == baseline[2].tolist() and fastpath[2][0] > 0, name
        np.testing.assert_allclose(baseline[0], fastpath[0], atol=1e-3, err_msg=name)
        np.testing.assert_allclose(baseline[1], fastpath[1], atol=1e-5, err_msg=name)
    messages = []
    for model in ("text_detection", "sync_detection"):
        with pytest.raises(InferenceServerException) as info:
            _detect(server, model, "IMAGE_BYTES", np.array([b"hello"], dtype=np.object_))
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
        messages.append(info.value.message())
    assert messages[0] == messages[1] and "input IMAGE_BYTES element 0 (5 bytes" in messages[0]
