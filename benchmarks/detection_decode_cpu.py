"""JPEG decode time per photo: OpenCV's IMREAD_UNCHANGED (BGR) then a BGR-to-RGB pass, against one decode
straight to RGB (``image.JPEG_FLAGS``), which ``text_detection`` runs for every JPEG of ``IMAGE_BYTES``.

Photos: benchmarks/gpu/detection_inputs.py's real photos (scikit-image), as the served detection benchmark
sends them: ``jpeg720`` (1280x720 frames) and ``jpegmixed`` (longer side 640-1920 px). One OpenCV thread, as
the GPU configuration runs decode (``opencv_threads 1``). Every photo is checked to decode to the same pixels
both ways before timing. Each variant runs ``--rounds`` times, alternating, over the same files; the table gives
the best round's milliseconds per photo and the ratio.

    .venv/bin/python benchmarks/detection_decode_cpu.py [--rounds 7] [--out docs/benchmarks/detection_decode_cpu]
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "backend"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from host_report import best_of_rounds, machine_line, write_result  # noqa: E402

from fastpath.models.text_detection.image import JPEG_FLAGS  # noqa: E402

WORKLOADS = {"jpeg720": "720_*.jpg", "jpegmixed": "mixed_*.jpg"}


def unchanged_then_rgb(data: np.ndarray) -> np.ndarray:
    """The decode before: IMREAD_UNCHANGED (BGR, or gray [H, W]), then OpenCV's channel conversion to RGB."""
    decoded = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    return cv2.cvtColor(decoded, cv2.COLOR_GRAY2RGB if decoded.ndim == 2 else cv2.COLOR_BGR2RGB)


def straight_to_rgb(data: np.ndarray) -> np.ndarray:
    """The decode as shipped: one imdecode to RGB, EXIF orientation ignored."""
    return cv2.imdecode(data, JPEG_FLAGS)


VARIANTS = {"unchanged_then_rgb": unchanged_then_rgb, "straight_to_rgb": straight_to_rgb}


def per_photo_ms(decode, files: list[np.ndarray]) -> float:
    started = time.perf_counter()
    for data in files:
        decode(data)
    return (time.perf_counter() - started) / len(files) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "detection_decode_cpu")
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gpu" / "detection_inputs.py"), "--out", directory],
                       check=True, stdout=subprocess.DEVNULL)
        for workload, pattern in WORKLOADS.items():
            paths = sorted(Path(directory).glob(pattern))
            files = [np.fromfile(path, np.uint8) for path in paths]
            for path, data in zip(paths, files):
                if not np.array_equal(unchanged_then_rgb(data), straight_to_rgb(data)):
                    raise SystemExit(f"{path.name}: the two decodes differ")
            best = best_of_rounds({name: functools.partial(per_photo_ms, decode, files) for name, decode in VARIANTS.items()},
                                  args.rounds)
            pixels = sum(int(np.prod(straight_to_rgb(data).shape[:2])) for data in files) / len(files)
            rows.append({"workload": workload, "photos": len(files), "mean_megapixels": round(pixels / 1e6, 2),
                         **{f"{name}_ms": round(ms, 3) for name, ms in best.items()},
                         "straight_over_unchanged": round(best["straight_to_rgb"] / best["unchanged_then_rgb"], 3)})
    machine = machine_line(f"OpenCV {cv2.__version__}")
    lines = ["| workload | photos | mean MP | IMREAD_UNCHANGED + BGR-to-RGB ms | straight to RGB ms | straight / before |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['photos']} | {r['mean_megapixels']} | {r['unchanged_then_rgb_ms']} | "
              f"{r['straight_to_rgb_ms']} | {r['straight_over_unchanged']} |" for r in rows]
    write_result(args.out, title="JPEG decode per photo: IMREAD_UNCHANGED and a channel pass, against straight to RGB",
                 intro="`text_detection` decodes each JPEG of `IMAGE_BYTES` straight to RGB (`IMREAD_COLOR_RGB | "
                       "IMREAD_IGNORE_ORIENTATION`); PNG keeps `IMREAD_UNCHANGED` for alpha and 16-bit samples. Every photo "
                       "decoded to the same pixels both ways (also gray, CMYK and EXIF-rotated files: "
                       "tests/unit/models/text_detection/test_image.py). One OpenCV thread (the GPU configuration's "
                       "`opencv_threads 1`), the best of the rounds.",
                 command=f".venv/bin/python benchmarks/detection_decode_cpu.py --rounds {args.rounds}",
                 machine=machine, settings={"rounds": args.rounds, "opencv_threads": 1}, rows=rows, table=lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
