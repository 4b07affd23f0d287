"""Text detection with PP-OCRv4 det (DB): images -> text quadrilaterals in input pixel coordinates.

Pipeline, in three stages a scheduler can drive separately (docs/design/text_detection.md):

    prepare(image)            uint8 RGB [H, W, 3] -> PreparedImage (resized uint8, its bucket key)
    run_batch(prepared list)  images of ONE resized shape -> probability maps, one engine call
    finish(prepared, map)     -> Detection (boxes float32 [K, 4, 2], scores float32 [K])

:meth:`TextDetector.detect` runs all three synchronously: images are grouped by resized shape
(the bucket key), each group cut into engine batches of at most ``max_batch_images``. Batching
never changes a result: the network is fully convolutional and each image of a batch has exactly
its own size, with no padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastpath.engines import Engine, load_engine
from fastpath.errors import ArtifactError, EngineError
from fastpath.models.text_detection.config import NETWORK_STRIDE_PX, TextDetectionConfig
from fastpath.models.text_detection.db_postprocess import boxes_from_probability_map
from fastpath.models.text_detection.preprocess import normalize_into, resize_image, resized_shape


@dataclasses.dataclass(frozen=True)
class Detection:
    """Text found in one image.

    Attributes:
        boxes: float32 [K, 4, 2]: (x, y) corners in the input image's pixels, clockwise from the
            top-left corner, within [0, width-1] x [0, height-1]. K may be 0.
        scores: float32 [K]: mean text probability inside each box, in [box_threshold, 1].
    """

    boxes: np.ndarray
    scores: np.ndarray


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """An image resized for the network; ``shape_hw`` is its batching bucket.

    Attributes:
        resized: uint8 RGB [h, w, 3], h and w multiples of 32.
        source_hw: (height, width) of the input image in pixels.
    """

    resized: np.ndarray
    source_hw: tuple[int, int]

    @property
    def shape_hw(self) -> tuple[int, int]:
        """Resized (height, width): images with equal keys can share an engine batch."""
        return self.resized.shape[0], self.resized.shape[1]

    @property
    def cells(self) -> int:
        """Resized size in 32x32 cells (the network's stride): the scheduler's cost length of this shape."""
        return (self.resized.shape[0] // NETWORK_STRIDE_PX) * (self.resized.shape[1] // NETWORK_STRIDE_PX)


def plan_batches(shapes: Sequence[tuple[int, int]], max_batch: int) -> list[list[int]]:
    """Group image indices by resized shape, in first-seen order, cut into runs of at most ``max_batch``.

    Returns:
        Lists of indices into ``shapes``; every index appears exactly once; each list has one shape.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for index, shape in enumerate(shapes):
        groups.setdefault(tuple(shape), []).append(index)
    return [group[start : start + max_batch] for group in groups.values() for start in range(0, len(group), max_batch)]


def batch_shape(batch: Sequence[PreparedImage]) -> tuple[int, int]:
    """The one resized (h, w) of a batch.

    Raises:
        EngineError: the batch is empty or mixes shapes (never padded: DB results would change).
    """
    shapes = {item.shape_hw for item in batch}
    if len(shapes) != 1:
        raise EngineError(f"a detection batch must have one resized shape; got {sorted(shapes)}")
    return shapes.pop()


def concatenate(detections: Sequence[Detection]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten per-image detections into one ragged result.

    Returns:
        boxes float32 [sum K, 4, 2], scores float32 [sum K], counts int32 [N]: image i's boxes
        are rows ``sum(counts[:i]) : sum(counts[:i + 1])``.
    """
    counts = np.asarray([len(d.scores) for d in detections], dtype=np.int32)
    boxes = np.concatenate([d.boxes for d in detections]) if detections else np.zeros((0, 4, 2), np.float32)
    scores = np.concatenate([d.scores for d in detections]) if detections else np.zeros((0,), np.float32)
    return np.ascontiguousarray(boxes, dtype=np.float32), np.ascontiguousarray(scores, dtype=np.float32), counts


def check_engine_io(engine: Engine, config: TextDetectionConfig) -> None:
    """Refuse an artifact whose tensors cannot serve the config.

    Needs one input with dynamic height and width (and a dynamic batch unless ``max_batch_images``
    is 1): float32 [batch, 3, height, width] (``model.onnx``, normalized BGR planes) or uint8
    [batch, height, width, 3] (``gpu_artifact``: ``model.uint8.onnx`` or an fp16 candidate, RGB as staged for a GPU); and a first output
    [batch, 1, height, width].

    Raises:
        ArtifactError: listing the artifact's input and output shapes against the requirement.
    """
    inputs, outputs = engine.inputs, engine.outputs
    listing = (f"artifact inputs {[(s.name, list(s.shape)) for s in inputs]}, outputs {[(s.name, list(s.shape)) for s in outputs]}")
    problems = []
    uint8 = len(inputs) == 1 and inputs[0].dtype == np.uint8
    if len(inputs) != 1 or len(inputs[0].shape) != 4 or (inputs[0].shape[3] if uint8 else inputs[0].shape[1]) != 3:
        problems.append("expected one input [batch, 3, height, width] (float32) or [batch, height, width, 3] (uint8)")
    else:
        batch, *spatial = inputs[0].shape
        height, width = spatial[:2] if uint8 else spatial[1:]
        if height != -1 or width != -1:
            problems.append("height and width must be dynamic (-1): images are resized to any multiple of 32")
        if batch != -1 and not (batch == 1 and config.max_batch_images == 1):
            problems.append(f"batch is fixed at {batch} but config max_batch_images = {config.max_batch_images}")
    if not outputs or len(outputs[0].shape) != 4 or outputs[0].shape[1] not in (1, -1):
        problems.append("expected a first output [batch, 1, height, width] (the DB probability map)")
    if problems:
        raise ArtifactError(f"the text-detection artifact does not fit the config: {'; '.join(problems)}; {listing}")


class TextDetector:
    """Engine + pre- and post-processing for one model version.

    Args:
        engine: maps float32 [B, 3, h, w] (normalized BGR; the CPU) or uint8 [B, h, w, 3] (RGB; the
            GPU engine, which normalizes on the device) to probability maps float32 [B, 1, h, w].
        config: the model's parameters.

    Raises:
        ArtifactError: the engine's tensors do not fit (see :func:`check_engine_io`).
    """

    def __init__(self, engine: Engine, config: TextDetectionConfig) -> None:
        check_engine_io(engine, config)
        self.engine = engine
        self.config = config
        self._input_name = engine.inputs[0].name
        self._output_name = engine.outputs[0].name
        self.uint8_input = engine.inputs[0].dtype == np.uint8

    @classmethod
    def from_directory(cls, directory: str | Path, config: TextDetectionConfig, *, device: str = "cpu",
                       batch_sizes: Sequence[int] = (1, 2, 4, 8)) -> TextDetector:
        """Load the artifact of one model version directory.

        Args:
            directory: the version directory.
            config: the model's parameters.
            device: ``cpu`` (``config.artifact`` on ONNX Runtime's CPU EP) or ``cuda[:N]``
                (``config.gpu_artifact``, ``model.uint8.onnx`` by default, on the CUDA EP; with ``max_cuda_graphs`` > 0, CUDA graphs for the ``capture_shapes_px`` of
                ``batch_sizes`` images: the onnxruntime loader's ``layout="images"``,
                :mod:`fastpath.engines.onnxruntime.image_cuda`).
            batch_sizes: the scheduler's batch buckets (graphs are captured for these).

        Raises:
            ArtifactError: the artifact is missing (run ``fastpath build``) or does not fit the config.
            EngineError: the artifact does not load (on a GPU: no onnxruntime-gpu, no device).
        """
        gpu = device.startswith("cuda")
        path = Path(directory) / (config.gpu_artifact if gpu else config.artifact)
        if not path.is_file():
            raise ArtifactError(f"{path} is missing; build the artifacts with 'fastpath build'")
        if gpu:
            engine = load_engine("onnxruntime", str(path), device=device, layout="images", batch_sizes=tuple(batch_sizes),
                                 **config.gpu_engine_options())
        else:
            engine = load_engine(config.runtime, str(path), **config.cpu_engine_options())
        try:
            return cls(engine, config)
        except ArtifactError:
            engine.close()
            raise

    def prepare(self, image: np.ndarray) -> PreparedImage:
        """Resize uint8 RGB [H, W, 3] for the network (see :mod:`fastpath.models.text_detection.preprocess`)."""
        height, width = image.shape[:2]
        config = self.config
        shape = resized_shape(height, width, config.limit_side_len_px, config.limit_type, config.max_resized_pixels)
        return PreparedImage(resize_image(image, shape), (height, width))

    def run_batch(self, batch: Sequence[PreparedImage]) -> np.ndarray:
        """One engine call for images of one resized shape, its input in a fresh numpy buffer.

        Returns:
            float32 [B, h, w] probability maps.

        Raises:
            EngineError: the batch mixes shapes, or the engine failed or returned the wrong shape.
        """
        height, width = batch_shape(batch)
        if self.uint8_input:
            return self.infer(np.stack([item.resized for item in batch]))
        feed = self.fill(batch, np.empty((len(batch), 3, height, width), dtype=np.float32))
        return self.infer(feed)

    def fill(self, batch: Sequence[PreparedImage], out: np.ndarray) -> np.ndarray:
        """Write the normalized images into ``out``, the engine input (e.g. a staging-pool block).

        Args:
            batch: images of one resized shape (h, w).
            out: float32 [B, 3, h, w] with B >= len(batch); rows from len(batch) on are filler:
                copies of row 0, which leave every real row's map unchanged (tested).

        Returns:
            ``out``.

        Raises:
            EngineError: the batch is empty, mixes shapes, or ``out`` has another shape or dtype.
        """
        height, width = batch_shape(batch)
        if out.dtype != np.float32 or out.ndim != 4 or out.shape[1:] != (3, height, width) or out.shape[0] < len(batch):
            raise EngineError(f"a detection feed for {len(batch)} images of {height}x{width} must be float32 "
                              f"[>={len(batch)}, 3, {height}, {width}]; got {out.dtype}{list(out.shape)}")
        for row, item in enumerate(batch):
            normalize_into(item.resized, out[row])
        out[len(batch):] = out[0]
        return out

    def infer(self, feed: np.ndarray) -> np.ndarray:
        """The engine call: float32 [B, 3, h, w] (or uint8 [B, h, w, 3]) -> probability maps float32 [B, h, w] (a new array).

        Raises:
            EngineError: the engine failed or returned another shape than [B, 1, h, w].
        """
        count, height, width = (feed.shape[:3] if self.uint8_input else (feed.shape[0], *feed.shape[2:]))
        output = self.engine.infer({self._input_name: feed})[self._output_name]
        if output.shape != (count, 1, height, width):
            raise EngineError(f"engine returned {self._output_name} of shape {list(output.shape)}; expected {[count, 1, height, width]}")
        return output[:, 0]

    def finish(self, prepared: PreparedImage, prob_map: np.ndarray) -> Detection:
        """DB post-processing of one image's probability map [h, w]."""
        boxes, scores = boxes_from_probability_map(prob_map, prepared.source_hw, self.config)
        return Detection(boxes, scores)

    def detect(self, images: Sequence[np.ndarray]) -> list[Detection]:
        """Detect text in uint8 RGB [H, W, 3] images; results in input order."""
        prepared = [self.prepare(image) for image in images]
        results: list[Detection | None] = [None] * len(prepared)
        for indices in plan_batches([p.shape_hw for p in prepared], self.config.max_batch_images):
            maps = self.run_batch([prepared[i] for i in indices])
            for index, prob_map in zip(indices, maps):
                results[index] = self.finish(prepared[index], prob_map)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Release the engine (idempotent)."""
        self.engine.close()
