"""``TritonPythonModel`` for text detection (``model_repository/text_detection``).

Inputs and outputs (see ``config.pbtxt``; max_batch_size 0, so the shapes below are the full
request shapes). A request carries exactly one of the two inputs:

    IMAGE        TYPE_UINT8  [N, H, W, C]  N raw images of one size, C = 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
    IMAGE_BYTES  TYPE_STRING [N]           N encoded PNG/JPEG files of any sizes (8- or 16-bit).
    BOXES        TYPE_FP32   [K, 4, 2]     every box of every image, (x, y) corners clockwise from top-left.
    SCORES       TYPE_FP32   [K]           one score per box.
    BOX_COUNTS   TYPE_INT32  [N]           boxes per image: image i owns rows sum(BOX_COUNTS[:i]) ... + BOX_COUNTS[i].

An image without text gives BOX_COUNTS 0 and, for a one-image request, BOXES [0, 4, 2] and
SCORES [0] (../shared/cases K05). A bad request (not an image, zero-sized, above a pixel limit)
gets its own 400; the other requests of the call are detected together, batched by resized shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.config import parse_parameters, triton_parameters
from fastpath.errors import InvalidInputError
from fastpath.models.text_detection import TextDetector, concatenate
from fastpath.triton.io import error_response, read_input
from fastpath.triton.selftest import run_self_test
from fastpath.vision.config import TextDetectionConfig
from fastpath.vision.image import ARRAY_INPUT, BYTES_INPUT, images_from_array, images_from_bytes


class TextDetectionModel:
    """The python-backend model class; ``model.py`` re-exports it as ``TritonPythonModel``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Parse the config, self-test the stub, load and check the engine.

        Raises:
            ConfigError, SelfTestError, ArtifactError, EngineError: the model refuses to load,
                and Triton reports the message.
        """
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        run_self_test(pb_utils.Tensor)
        model_config = json.loads(args["model_config"])
        self.config = parse_parameters(TextDetectionConfig, triton_parameters(model_config))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.detector = TextDetector.from_directory(version_dir, self.config)
        self.model_version = args["model_version"]

    def _read_images(self, request: Any) -> list[np.ndarray]:
        present = [name for name in (ARRAY_INPUT, BYTES_INPUT) if self._pb.get_input_tensor_by_name(request, name) is not None]
        if len(present) != 1:
            raise InvalidInputError(f"send exactly one of the inputs {ARRAY_INPUT} (UINT8 [N, H, W, C]) or {BYTES_INPUT} "
                                    f"(BYTES [N], PNG/JPEG files); the request has {present or 'neither'}")
        config = self.config
        limits = {"max_image_pixels": config.max_image_pixels, "max_request_pixels": config.max_request_pixels,
                  "max_images": config.max_images_per_request}
        values = read_input(self._pb, request, present[0])
        if present[0] == ARRAY_INPUT:
            return images_from_array(values, **limits)
        return images_from_bytes(values, **limits)

    def _response(self, detections: list[Any]) -> Any:
        boxes, scores, counts = concatenate(detections)
        pb = self._pb
        return pb.InferenceResponse(output_tensors=[pb.Tensor("BOXES", boxes), pb.Tensor("SCORES", scores),
                                                    pb.Tensor("BOX_COUNTS", counts)])

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer each request with its boxes or its own error; one detection pass for all of them."""
        pb = self._pb
        responses: list[Any] = [None] * len(requests)
        accepted: list[tuple[int, list[np.ndarray]]] = []
        for index, request in enumerate(requests):
            try:
                accepted.append((index, self._read_images(request)))
            except Exception as exc:  # a bad request fails alone
                responses[index] = error_response(pb, exc)
        if not accepted:
            return responses
        try:
            detections = self.detector.detect([image for _, images in accepted for image in images])
        except Exception as exc:
            for index, _ in accepted:
                responses[index] = error_response(pb, exc)
            return responses
        start = 0
        for index, images in accepted:
            responses[index] = self._response(detections[start : start + len(images)])
            start += len(images)
        return responses

    def finalize(self) -> None:
        """Release the engine."""
        detector = getattr(self, "detector", None)
        if detector is not None:
            detector.close()
