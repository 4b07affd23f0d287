"""Test helpers for text detection: real photos from scikit-image's wheel, the rapidocr reference, IoU matching.

The reference is the rapidocr-onnxruntime package's own ``TextDetector`` run in-process, configured
with the shipped resize policy (model_repository/text_detection/config.pbtxt: ``limit_type="min"``,
shorter side raised to 736) and DB parameters.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

LIMIT_TYPE = "min"  # the shipped config.pbtxt policy
LIMIT_SIDE_LEN_PX = 736
MIN_IOU = 0.9  # served and reference boxes are matched one-to-one at IoU >= this


def skimage_path(name: str) -> Path:
    """A photo that ships in scikit-image's wheel (``skimage/data/<name>``); found without importing
    scikit-image, whose build may need another numpy than the one loaded."""
    import importlib.util

    return Path(importlib.util.find_spec("skimage").origin).parent / "data" / name


def skimage_rgb(name: str, scale: float = 1.0) -> np.ndarray:
    """uint8 RGB [H, W, 3] of ``skimage/data/<name>`` (gray replicated), optionally scaled bilinearly."""
    rgb = np.asarray(Image.open(skimage_path(name)).convert("RGB"))
    if scale != 1.0:
        rgb = cv2.resize(rgb, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(rgb)


def png_bytes(image: np.ndarray) -> bytes:
    """PNG encoding of uint8/uint16 gray [H, W] or RGB(A) [H, W, C] (channels in RGB order)."""
    if image.ndim == 3 and image.shape[2] >= 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR if image.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, encoded = cv2.imencode(".png", image)
    assert ok
    return encoded.tobytes()


def with_broken_crc(png: bytes, chunk: bytes) -> bytes:
    """``png`` with the CRC of its first ``chunk`` chunk (e.g. b"IHDR", b"IDAT") inverted: the data stays intact,
    the checksum no longer matches it (PNG spec 5.3: 4-byte length, 4-byte type, data, 4-byte CRC)."""
    start = png.index(chunk) - 4
    crc_at = start + 8 + int.from_bytes(png[start:start + 4], "big")
    return png[:crc_at] + bytes(b ^ 0xFF for b in png[crc_at:crc_at + 4]) + png[crc_at + 4:]


def jpeg_bytes(image_rgb: np.ndarray, quality: int = 95) -> bytes:
    """JPEG encoding (Pillow) of uint8 RGB [H, W, 3]."""
    buffer = io.BytesIO()
    Image.fromarray(image_rgb).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


@functools.lru_cache(maxsize=2)
def rapidocr_detector(limit_type: str = LIMIT_TYPE, limit_side_len_px: int = LIMIT_SIDE_LEN_PX):
    """rapidocr-onnxruntime's ``TextDetector`` with a resize policy (default: the shipped one) and FastPath's DB parameters."""
    import rapidocr_onnxruntime
    from rapidocr_onnxruntime.ch_ppocr_det import TextDetector
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

    root = Path(rapidocr_onnxruntime.__file__).parent
    config = {
        "model_path": str(root / "models" / "ch_PP-OCRv4_det_infer.onnx"),
        "limit_side_len": limit_side_len_px, "limit_type": limit_type, "mean": [0.5] * 3, "std": [0.5] * 3,
        "thresh": 0.3, "box_thresh": 0.5, "max_candidates": 1000, "unclip_ratio": 1.6, "use_dilation": True,
        "score_mode": "fast", "use_cuda": False, "use_dml": False, "intra_op_num_threads": -1, "inter_op_num_threads": -1,
    }
    detector = TextDetector(config)
    # rapidocr raises its "max" limit to 1500/2000 for large images; pin it to the shipped policy
    detector.get_preprocess = lambda _max_wh: DetPreProcess(limit_side_len_px, limit_type, [0.5] * 3, [0.5] * 3)
    return detector


def reference_boxes(image_rgb: np.ndarray, limit_type: str = LIMIT_TYPE, limit_side_len_px: int = LIMIT_SIDE_LEN_PX) -> np.ndarray:
    """float32 [K, 4, 2] boxes rapidocr finds in uint8 RGB [H, W, 3] (it takes BGR, as OpenCV decodes)."""
    boxes, _elapsed = rapidocr_detector(limit_type, limit_side_len_px)(np.ascontiguousarray(image_rgb[..., ::-1]))
    if boxes is None or len(boxes) == 0:
        return np.zeros((0, 4, 2), dtype=np.float32)
    return np.asarray(boxes, dtype=np.float32)


def quad_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two quadrilaterals [4, 2] (shapely polygons)."""
    from shapely.geometry import Polygon

    pa, pb = Polygon(a), Polygon(b)
    union = pa.union(pb).area
    return float(pa.intersection(pb).area / union) if union > 0 else 0.0


def match_ious(served: np.ndarray, reference: np.ndarray) -> list[float]:
    """Greedy one-to-one matching of boxes by IoU (best pair first); the IoU of each reference box's match.

    An unmatched reference box counts 0; extra served boxes make the count check fail instead.
    """
    pairs = sorted(((quad_iou(s, r), i, j) for i, s in enumerate(served) for j, r in enumerate(reference)), reverse=True)
    used_served, best = set(), [0.0] * len(reference)
    for iou, i, j in pairs:
        if i not in used_served and best[j] == 0.0 and iou > 0:
            used_served.add(i)
            best[j] = iou
    return best


def assert_matches_reference(served: np.ndarray, reference: np.ndarray, min_iou: float = MIN_IOU) -> None:
    """Same number of boxes, each reference box matched by a served box at IoU >= ``min_iou``."""
    assert served.shape == (len(reference), 4, 2), (served.shape, reference.shape)
    ious = match_ious(served, reference)
    assert min(ious, default=1.0) >= min_iou, ious


@functools.lru_cache(maxsize=4)
def blank_png(height: int, width: int, value: int = 255) -> bytes:
    """A valid 8-bit grayscale PNG of one gray level, made row by row (never holds H*W bytes).

    A 12000x12000 white page compresses to ~140 KB: a decompression bomb for a server that
    decodes before checking the size.
    """
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes([value]) * width  # filter type 0, then the samples
    compressor = zlib.compressobj(6)
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit, grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


LABELS_PATH = Path(__file__).resolve().parents[3] / "data" / "text_detection_boxes.json"
RECALL_IOU = 0.5  # a reference box counts as found when a detected box overlaps it at IoU >= this


def labelled_boxes() -> dict[str, np.ndarray]:
    """Hand-labelled reference rectangles per photo (tests/data/text_detection_boxes.json, its "note"
    says how): ``{name: int [R, 4]}``, rows ``[x0, y0, x1, y1]`` in source pixels."""
    import json

    images = json.loads(LABELS_PATH.read_text())["images"]
    return {name: np.asarray(boxes, dtype=np.int64).reshape(-1, 4) for name, boxes in images.items()}


def rect_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two axis-aligned rectangles ``[x0, y0, x1, y1]`` (float pixel coordinates)."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, float(width)) * max(0.0, float(height))
    union = float((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])) - inter
    return inter / union if union > 0 else 0.0


def recall(detected: np.ndarray, reference: np.ndarray, min_iou: float = RECALL_IOU) -> float:
    """Fraction of reference rectangles matched one-to-one (greedy, best IoU first) by a detected box.

    Args:
        detected: float32 [K, 4, 2] quadrilaterals; each is compared through its axis-aligned
            bounding rectangle (min/max of its corners), not its polygon.
        reference: [R, 4] rectangles ``[x0, y0, x1, y1]``.
        min_iou: a pair counts at IoU >= this.

    Returns:
        matched / R in [0, 1] (1.0 when R is 0).
    """
    rects = [np.concatenate([quad.min(axis=0), quad.max(axis=0)]) for quad in np.asarray(detected, np.float64)]
    pairs = sorted(((rect_iou(d, r), i, j) for i, d in enumerate(rects) for j, r in enumerate(reference)), reverse=True)
    used_detected, matched = set(), set()
    for iou, i, j in pairs:
        if iou >= min_iou and i not in used_detected and j not in matched:
            used_detected.add(i)
            matched.add(j)
    return len(matched) / len(reference) if len(reference) else 1.0
