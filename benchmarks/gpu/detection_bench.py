"""Shared by benchmarks/gpu/detection_engine.py and detection_graphs.py: the served text_detection engine and its photos.

:class:`Bench` is the engine of configs/gpu.pbtxt (``load_engine(..., layout="images")``, one option changed per
variant) with the served batch handler and pinned staging pool; on ``cpu`` (the dry run) the CPU EP engine of the same
artifact. Photos come from ``--inputs`` (benchmarks/gpu/detection_inputs.py), resized as served; without them, noise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_numerics import VERSION_DIR, decode, gpu_config  # noqa: E402

PHOTO_HW = (736, 1312)  # a 1280x720 frame under configs/gpu.pbtxt's min/736 resize
CPU_SHAPES = ((1, 96, 160), (2, 96, 160), (1, 160, 96))  # the dry run's (batch, height, width)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def call_times(images: int, times: list[float]) -> dict:
    """Median and p90 of call times (seconds) in ms, and images/s at the median for calls of ``images`` images."""
    times = sorted(times)
    median = times[len(times) // 2]
    return {"median_ms": ms(median), "p90_ms": ms(times[int(len(times) * 0.9)]), "images_per_s": round(images / median, 1)}


def cuda_missing() -> str | None:
    """Why the CUDA engine cannot run here, or None."""
    import onnxruntime as ort

    from fastpath.memory.cuda import probe_cuda

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (available: {', '.join(providers)})"
    return None if probe_cuda().available else f"no usable CUDA device: {probe_cuda().reason}"


def build_engine(device: str, **changes):
    """The served GPU engine (configs/gpu.pbtxt's options, ``changes`` on top); on ``cpu`` the CPU engine of the same artifact."""
    from fastpath.engines import load_engine
    from fastpath.models.text_detection.config import UINT8_ARTIFACT

    config, sched = gpu_config()
    path = str(VERSION_DIR / UINT8_ARTIFACT)
    if device == "cpu":
        return load_engine("onnxruntime", path, **config.cpu_engine_options())
    return load_engine("onnxruntime", path, device=device, layout="images", batch_sizes=sched.batch_buckets,
                       **{**config.gpu_engine_options(), **changes})


class Bench:
    """An engine with the served batch handler (GPU) or plain ``infer`` (CPU), and the photos to feed it."""

    def __init__(self, device: str, photos: list, **changes) -> None:
        from fastpath.memory import PoolConfig, create_host_pool
        from fastpath.models.text_detection.device_batches import DeviceBatchHandler
        from fastpath.models.text_detection.pipeline import TextDetector

        self.config = gpu_config()[0]
        self.engine = build_engine(device, **changes)
        self.detector = TextDetector(self.engine, self.config)
        self.gpu = device != "cpu"
        self.pool = create_host_pool(PoolConfig(capacity_bytes=1 << 30, max_block_bytes=1 << 29), name="bench", device=device)
        self.handler = DeviceBatchHandler(self.detector, self.pool) if self.gpu else None
        self.photos = photos
        self._batches: dict = {}

    def batch(self, shape: tuple[int, int, int], k: int = 0) -> list:
        """``shape[0]`` PreparedImages of exactly (H, W) (cached): photos of that shape, else transposed or resized
        ones, else noise; ``k`` picks another set of photos."""
        import cv2

        from fastpath.models.text_detection.pipeline import PreparedImage

        size, height, width = shape
        if (shape, k) not in self._batches:
            same = [p.resized for p in self.photos if p.shape_hw in ((height, width), (width, height))]
            pool = same or [p.resized for p in self.photos] or [np.random.default_rng(k).integers(0, 256, (height, width, 3), np.uint8)]
            rows = [pool[(k * size + row) % len(pool)] for row in range(size)]
            rows = [np.ascontiguousarray(r.transpose(1, 0, 2)) if r.shape[:2] == (width, height) and width != height else r for r in rows]
            rows = [r if r.shape[:2] == (height, width) else cv2.resize(r, (width, height), interpolation=cv2.INTER_AREA) for r in rows]
            self._batches[shape, k] = [PreparedImage(r, (height, width)) for r in rows]
            if self.gpu:  # the staging blocks of a call (input and maps at once) exist before any call is timed
                for lease in [self.pool.lease(size * height * width * n) for n in (3, 4)]:
                    lease.release()
        return self._batches[shape, k]

    def served(self, batch: list, keep: bool = False) -> tuple[float, np.ndarray | None]:
        """One served engine call (stage into the pool, H2D, run, D2H); seconds, and a copy of the maps if ``keep``."""
        start = time.perf_counter()
        if self.handler is None:
            maps = self.detector.run_batch(batch)
        else:
            result = self.handler.run(self.handler.stage_images(batch, len(batch), batch[0].shape_hw))
            maps = result.maps.copy() if keep else None
            result.lease.release()
        return time.perf_counter() - start, maps

    def resident(self, shape: tuple[int, int, int]) -> float:
        """Seconds of one device-resident call (the CPU engine has no device: a plain call)."""
        start = time.perf_counter()
        _ = self.engine.run_resident(shape) if self.gpu else self.detector.run_batch(self.batch(shape))
        return time.perf_counter() - start

    def close(self) -> None:
        self.detector.close()
        self.pool.close()


def load_photos(inputs: Path | None) -> tuple[list, list[bytes]]:
    """(the 1280x720 JPEGs and every PNG of ``inputs`` decoded and resized as served; the PNG files). Empty without inputs."""
    from fastpath.models.text_detection.pipeline import PreparedImage
    from fastpath.models.text_detection.preprocess import resize_image, resized_shape

    if inputs is None or not inputs.is_dir():
        return [], []
    config, photos = gpu_config()[0], []
    for path in sorted(inputs.glob("720_*.jpg")) + sorted(inputs.glob("*.png")):
        image = decode(path.read_bytes())
        shape = resized_shape(*image.shape[:2], config.limit_side_len_px, config.limit_type, config.max_resized_pixels)
        photos.append(PreparedImage(resize_image(image, shape), image.shape[:2]))
    return photos, [path.read_bytes() for path in sorted(inputs.glob("*.png"))]
