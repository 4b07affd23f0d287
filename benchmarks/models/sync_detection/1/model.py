"""Benchmark baseline 'sync_detection': text_detection's synchronous path, without FastPath's scheduler.

Benchmark code, not product code (benchmarks/text_detection_cpu.py). ``execute`` blocks: it reads,
decodes and resizes each request's images, runs ``TextDetector.detect`` on them (images of one
request grouped by resized shape, numpy feed buffers, no staging pool) and returns the responses.
With ``max_batch_size: 0`` and no dynamic batcher Triton hands it one request per call, so requests
never share an engine call.
"""

import json
from pathlib import Path

from fastpath.config import parse_parameters, triton_parameters
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.model import TextDetectionModel
from fastpath.models.text_detection.pipeline import TextDetector, concatenate
from fastpath.triton.io import error_response


class TritonPythonModel(TextDetectionModel):
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        self.config = parse_parameters(TextDetectionConfig, triton_parameters(json.loads(args["model_config"])))
        self.detector = TextDetector.from_directory(Path(args["model_repository"]) / args["model_version"], self.config)

    def execute(self, requests):
        pb, responses = self._pb, []
        for request in requests:
            try:
                boxes, scores, counts = concatenate(self.detector.detect(self._read_images(request)))
                responses.append(pb.InferenceResponse(output_tensors=[
                    pb.Tensor("BOXES", boxes), pb.Tensor("SCORES", scores), pb.Tensor("BOX_COUNTS", counts)]))
            except Exception as exc:  # a bad request fails alone
                responses.append(error_response(pb, exc))
        return responses

    def finalize(self):
        self.detector.close()
