"""text_detection resize policies: boxes, recall and time per image on the labelled test photos.

Runs the shipped CPU path (``TextDetector`` on ONNX Runtime CPU with the fp32 artifact that ``make``
builds into model_repository/text_detection/1/) on scikit-image's ``text.png`` and ``page.png``
(grayscale, as the tests load them) under ``limit_type`` ``max`` / ``limit_side_len_px`` 960
(PaddleOCR's detector default) and ``min`` / 736 (rapidocr's pipeline default). Recall: the
fraction of the hand-labelled reference boxes (tests/data/text_detection_boxes.json) matched
one-to-one by a detected box at IoU >= 0.5, IoU taken between axis-aligned bounding rectangles
(tests/unit/models/text_detection/reference.py ``recall``). Time per image: median wall time of
``detect([image])`` (resize + engine + DB post-processing) over ``--repeats`` runs after one warm-up
run, on however many cores the machine has (ONNX Runtime intra-op threads = CPUs).

    .venv/bin/python benchmarks/text_detection_resize.py [--repeats 9] [--out docs/benchmarks/text_detection_resize]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fastpath.models.text_detection.config import TextDetectionConfig  # noqa: E402
from fastpath.models.text_detection.pipeline import TextDetector  # noqa: E402
from fastpath.models.text_detection.preprocess import resized_shape  # noqa: E402
from tests.unit.models.text_detection.reference import labelled_boxes, recall, skimage_rgb  # noqa: E402

POLICIES = [("max", 960), ("min", 736)]
VERSION_DIR = REPO_ROOT / "model_repository" / "text_detection" / "1"


def measure(limit_type: str, limit: int, repeats: int) -> list[dict]:
    """One row per labelled photo: resized shape, boxes, recall and median seconds per image."""
    config = TextDetectionConfig(limit_type=limit_type, limit_side_len_px=limit)
    detector = TextDetector.from_directory(VERSION_DIR, config)
    rows = []
    try:
        for name, reference in labelled_boxes().items():
            image = skimage_rgb(name)
            detection = detector.detect([image])[0]
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                detector.detect([image])
                times.append(time.perf_counter() - start)
            rows.append({
                "policy": f"{limit_type}/{limit}", "image": name, "source_hw": list(image.shape[:2]),
                "resized_hw": list(resized_shape(*image.shape[:2], limit, limit_type, config.max_resized_pixels)),
                "boxes": len(detection.scores), "reference_boxes": len(reference),
                "recall": round(recall(detection.boxes, reference), 4),
                "ms_per_image": round(statistics.median(times) * 1000, 1),
            })
    finally:
        detector.close()
    return rows


def markdown(rows: list[dict], repeats: int) -> str:
    lines = ["# text_detection resize policies: recall and time on the labelled photos", "",
             "`benchmarks/text_detection_resize.py`: ONNX Runtime CPU, fp32 artifact, "
             f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), shared dev machine; "
             f"median of {repeats} runs of `detect([image])` after a warm-up. Recall: hand-labelled boxes "
             "(tests/data/text_detection_boxes.json) matched one-to-one at IoU >= 0.5 of axis-aligned "
             "bounding rectangles.", "",
             "| policy | image | source h x w | resized h x w | boxes | reference | recall | ms / image |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['policy']} | {row['image']} | {row['source_hw'][0]}x{row['source_hw'][1]} | "
                     f"{row['resized_hw'][0]}x{row['resized_hw'][1]} | {row['boxes']} | {row['reference_boxes']} | "
                     f"{row['recall']:.2f} | {row['ms_per_image']} |")
    for policy in dict.fromkeys(row["policy"] for row in rows):
        part = [row for row in rows if row["policy"] == policy]
        found = sum(row["recall"] * row["reference_boxes"] for row in part)
        total = sum(row["reference_boxes"] for row in part)
        lines.append(f"| **{policy}** | both | | | {sum(r['boxes'] for r in part)} | {total} | {found / total:.2f} | "
                     f"{sum(r['ms_per_image'] for r in part) / len(part):.1f} (mean) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "benchmarks" / "text_detection_resize"),
                        help="path without suffix: writes .json and .md")
    args = parser.parse_args()
    rows = [row for limit_type, limit in POLICIES for row in measure(limit_type, limit, args.repeats)]
    table = markdown(rows, args.repeats)
    print(table)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"repeats": args.repeats, "cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
