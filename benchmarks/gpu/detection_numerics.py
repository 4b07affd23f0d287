"""Step 1 of benchmarks/gpu/served_detection_gpu.py: boxes of the GPU paths against the CPU path, per photo.

The CPU path (``model.onnx``, CPU EP, exact shapes, OpenCV decode) is the reference. Compared: the GPU path
(``model.uint8.onnx``, CUDA EP) at the exact shape in float32 and in TF32, padded to a shape bucket of
``PAD_SIDES_PX`` (the opt-in ``bucket_sides_px``), and, for JPEG photos, ``decode_device cuda`` (nvJPEG,
resize and staging on the device). Each: box counts and the smallest IoU of greedily matched boxes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VERSION_DIR = ROOT / "model_repository" / "text_detection" / "1"
GPU_CONFIG = ROOT / "model_repository" / "text_detection" / "configs" / "gpu.pbtxt"


def gpu_config():
    """(TextDetectionConfig, DetectionSchedulerConfig) of the shipped configs/gpu.pbtxt."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from fastpath.config import parse_sections, triton_parameters
    from fastpath.models.text_detection.config import DetectionSchedulerConfig, TextDetectionConfig

    config = text_format.Parse(GPU_CONFIG.read_text(), model_config_pb2.ModelConfig())
    as_json = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    return parse_sections(triton_parameters(as_json), TextDetectionConfig, DetectionSchedulerConfig)


def decode(data: bytes) -> np.ndarray:
    from fastpath.models.text_detection.probe import images_from_bytes

    return images_from_bytes(np.array([data], dtype=object), max_image_pixels=1 << 30, max_request_pixels=1 << 30, max_images=1)[0]


PAD_SIDES_PX = (736, 832, 992, 1088, 1312, 1472, 1664, 1920, 2208, 2848)  # a candidate bucket set, ~1.13x apart
VARIANTS = ("fp32", "tf32", "fp32_padded", "nvjpeg")


def quad_iou(a: np.ndarray, b: np.ndarray) -> float:
    import cv2

    a, b = a.astype(np.float32), b.astype(np.float32)
    inter, _ = cv2.intersectConvexConvex(a, b)
    union = cv2.contourArea(a) + cv2.contourArea(b) - inter
    return float(inter / union) if union > 0 else 1.0


def compare(reference, other) -> dict:
    """Box counts and, greedily matched, the smallest IoU (1.0 when both are empty)."""
    ious, used = [], set()
    for box in reference.boxes:
        scores = [(quad_iou(box, cand), j) for j, cand in enumerate(other.boxes) if j not in used]
        if scores:
            best, j = max(scores)
            used.add(j)
            ious.append(best)
    return {"boxes": len(reference.boxes), "other_boxes": len(other.boxes), "min_iou": round(min(ious, default=1.0), 4)}


def numerics(photos: list[Path], device: str) -> dict:
    """The CPU path vs the GPU paths (float32, TF32, float32 padded to a bucket, nvJPEG), per photo."""
    import dataclasses

    from fastpath.graphs import ImageSideBuckets
    from fastpath.memory import PoolConfig, create_host_pool
    from fastpath.models.text_detection.device_batches import DeviceBatchHandler
    from fastpath.models.text_detection.pipeline import TextDetector

    config, sched = gpu_config()
    cpu = TextDetector.from_directory(VERSION_DIR, config)
    pool = create_host_pool(PoolConfig(capacity_bytes=1 << 30, max_block_bytes=1 << 29), name="numerics", device=device)
    handlers = {name: DeviceBatchHandler(TextDetector.from_directory(VERSION_DIR, dataclasses.replace(config, cuda_tf32=tf32),
                                                                     device=device, batch_sizes=sched.batch_buckets), pool)
                for name, tf32 in (("fp32", False), ("tf32", True))}
    buckets = ImageSideBuckets(PAD_SIDES_PX)
    nvjpeg, rows = jpeg_decoder(device), []
    for path in photos:
        image = decode(path.read_bytes())
        prepared = cpu.prepare(image)
        reference = cpu.finish(prepared, cpu.run_batch([prepared])[0])
        h, w = prepared.shape_hw
        padded = buckets.snap(prepared.shape_hw)
        results = {}
        for name, handler, bucket in (("fp32", handlers["fp32"], prepared.shape_hw), ("tf32", handlers["tf32"], prepared.shape_hw),
                                      ("fp32_padded", handlers["fp32"], padded)):
            maps = handler.run(handler.stage_images([prepared], 1, bucket))
            results[name] = compare(reference, handler.detector.finish(prepared, maps.maps[0][:h, :w]))
            maps.lease.release()
        if nvjpeg is not None and path.suffix == ".jpg":
            results["nvjpeg"] = on_nvjpeg(nvjpeg, handlers["fp32"], path.read_bytes(), image, reference, config)
        rows.append({"photo": path.name, "source_hw": list(image.shape[:2]), "resized_hw": [h, w], "padded_hw": list(padded),
                     "padded_pixels_ratio": round(padded[0] * padded[1] / (h * w), 3), **results})
    for handler in handlers.values():
        handler.detector.close()
    cpu.close()
    pool.close()
    summary = {}
    for name in VARIANTS:
        measured = [r[name] for r in rows if name in r]
        if measured:
            summary[name] = {"photos": len(measured), "counts_equal": sum(m["boxes"] == m["other_boxes"] for m in measured),
                             "min_iou": min(m["min_iou"] for m in measured),
                             "median_min_iou": round(float(np.median([m["min_iou"] for m in measured])), 4)}
    if nvjpeg is None:
        summary["nvjpeg"] = "not measured: torchvision's nvJPEG decoder did not load"
    return {"photos": rows, "summary": summary}


def jpeg_decoder(device: str):
    """The served ``decode_device cuda`` decoder, or None (printed) where torchvision cannot decode on ``device``."""
    from fastpath.models.text_detection.device_decode import DeviceJpegDecoder

    try:
        return DeviceJpegDecoder(device)
    except Exception as exc:  # ConfigError naming what is missing
        print("nvJPEG not measured:", exc, flush=True)
        return None


def on_nvjpeg(decoder, handler, data: bytes, image: np.ndarray, reference, config) -> dict:
    """One JPEG through nvJPEG, the device resize and device staging (D2D into the engine), against ``reference``."""
    from fastpath.models.text_detection.device_decode import prepare_on_device

    (decoded,) = decoder.images([data], [image.shape[:2]])
    pixels = np.abs(decoded.permute(1, 2, 0).cpu().numpy().astype(np.int16) - image.astype(np.int16))
    prepared = prepare_on_device(decoded, config)
    maps = handler.run(handler.stage_images([prepared], 1, prepared.shape_hw))
    result = compare(reference, handler.detector.finish(prepared, maps.maps[0]))
    maps.lease.release()
    return {**result, "pixel_mean_abs_diff": round(float(pixels.mean()), 3), "pixel_max_abs_diff": int(pixels.max())}
