"""Baseline python-backend models of text detection (benchmark code, not product code).

    sync_detection   text_detection's synchronous path on the CPU (benchmarks/text_detection_cpu.py)
    naive_detection  the model a user writes for a GPU: ONNX Runtime's CUDA EP with numpy in and out
                     (pageable copies made by ONNX Runtime), no IOBinding, no graphs, no staging pool
                     (benchmarks/gpu/served_detection_gpu.py)

``execute`` blocks: each request's images are decoded and resized in Triton's thread and run through
``TextDetector.detect`` (images of one request grouped by resized shape, a fresh float32 feed per call),
then answered. ``max_batch_size: 0`` and no dynamic batcher: one request per call, requests never share
an engine call. Both read the same inputs and give the same outputs as ``text_detection``.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastpath.config import instance_device, parse_parameters, triton_parameters
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.model import TextDetectionModel
from fastpath.models.text_detection.pipeline import TextDetector, concatenate
from fastpath.triton.io import error_response


class BaselineDetectionModel(TextDetectionModel):
    """``device = "cpu"``: the artifact on ONNX Runtime's CPU EP; ``"gpu"``: on the CUDA EP of the instance's GPU."""

    device = "cpu"

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        self.config = parse_parameters(TextDetectionConfig, triton_parameters(json.loads(args["model_config"])))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        if self.device == "gpu":
            device = instance_device(args, None, runtime=self.config.runtime, gpu_runtimes=("onnxruntime",))
            provider = ("CUDAExecutionProvider", {"device_id": str(int(device.partition(":")[2] or 0))})
            engine = OnnxRuntimeEngine(str(version_dir / self.config.artifact), providers=(provider,))
            self.detector = TextDetector(engine, self.config)
        else:
            self.detector = TextDetector.from_directory(version_dir, self.config)

    def execute(self, requests):
        pb, responses = self._pb, []
        for request in requests:
            try:
                boxes, scores, counts = concatenate(self.detector.detect(self.images(request)))
                responses.append(pb.InferenceResponse(output_tensors=[
                    pb.Tensor("BOXES", boxes), pb.Tensor("SCORES", scores), pb.Tensor("BOX_COUNTS", counts)]))
            except Exception as exc:  # a bad request fails alone
                responses.append(error_response(pb, exc))
        return responses

    def finalize(self):
        self.detector.close()
