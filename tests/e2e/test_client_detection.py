"""Client.detect_text / AsyncClient.detect_text against the real text_detection model.

Skips, naming what is missing, when model_repository/text_detection is not built or does not load.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

from fastpath_client import AsyncClient, Client, InvalidInputError
from tests.conftest import MODEL_REPOSITORY, start_server

pytestmark = pytest.mark.e2e
MODEL = "text_detection"


@pytest.fixture(scope="module")
def detection_server(tmp_path_factory):
    if not (MODEL_REPOSITORY / MODEL / "config.pbtxt").is_file():
        pytest.skip(f"model {MODEL} is not in {MODEL_REPOSITORY}")
    try:
        server = start_server(tmp_path_factory.mktemp("detection"), models=(MODEL,))
    except Exception as exc:  # noqa: BLE001 - any start failure means the model is not servable here
        pytest.skip(f"model {MODEL} does not load ({type(exc).__name__}: {exc}); run `fastpath build`")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def photos():
    data = pytest.importorskip("skimage.data", reason="scikit-image ships the real photos")
    return [data.page(), data.coffee(), data.astronaut()]  # page(): a scanned page, grayscale HxW


def _check(found, image):
    height, width = image.shape[:2]
    assert found.boxes.dtype == np.float32 and found.boxes.shape[1:] == (4, 2)
    assert found.scores.dtype == np.float32 and found.scores.shape == (len(found.boxes),)
    assert ((found.scores >= 0) & (found.scores <= 1)).all()
    assert (found.boxes[..., 0] >= -1).all() and (found.boxes[..., 0] <= width + 1).all()
    assert (found.boxes[..., 1] >= -1).all() and (found.boxes[..., 1] <= height + 1).all()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_detect_text_sync_async_and_encoded_agree(detection_server, photos, protocol):
    url = detection_server.http_url if protocol == "http" else detection_server.grpc_url
    with Client(url, protocol) as client:
        found = client.detect_text(photos)
        encoded = None
        try:
            from PIL import Image

            files = []
            for photo in photos:
                buffer = io.BytesIO()
                Image.fromarray(photo).save(buffer, format="PNG")
                files.append(buffer.getvalue())
            encoded = client.detect_text(files)
        except (ImportError, InvalidInputError):
            pass  # no PIL, or the model takes raw pixels only

    async def run():
        async with AsyncClient(url, protocol) as client:
            return await client.detect_text(photos)

    concurrent = asyncio.run(run())
    assert len(found) == len(photos) and len(found[0].boxes) > 0  # the page has lines of text
    for image, one, other in zip(photos, found, concurrent):
        _check(one, image)
        np.testing.assert_allclose(other.boxes, one.boxes, atol=1e-3)
    if encoded is not None:
        for one, other in zip(found, encoded):
            np.testing.assert_allclose(other.boxes, one.boxes, atol=1e-3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_status_on_a_server_without_fastpath_admin_says_how_to_load_it(detection_server, protocol):
    from fastpath_client import ModelNotFoundError

    url = detection_server.http_url if protocol == "http" else detection_server.grpc_url
    with Client(url, protocol) as client, pytest.raises(ModelNotFoundError, match="add `--model fastpath_admin`"):
        client.status(MODEL)
