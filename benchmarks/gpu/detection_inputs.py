"""Real photos for the text_detection GPU benchmark (benchmarks/gpu/served_detection_gpu.py).

scikit-image's wheel ships real photos (a sign, a scanned page, a rocket, a cat, coffee, ...). Writes into
``--out``:
  720_<name>.jpg          each photo centre-cropped to 16:9 and resized to 1280x720 (JPEG quality 90), the
                          common camera frame; 720_<name>.png the same as PNG for the first three photos;
  mixed_<name>_<L>.jpg    each photo with its longer side resized to L = 640, 960, 1280, 1920 px (aspect
                          kept), so resized shapes fall in several shape buckets;
  orig_<name>.png / .jpg  the photos at their own size (the numerics step): PNG for the two text photos.
Runs anywhere scikit-image and OpenCV import (``make`` installs both into .venv).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

PHOTOS = ("text", "page", "astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field", "retina",
          "motorcycle")


def load(name: str) -> np.ndarray:
    """uint8 RGB of a scikit-image photo (gray photos replicated to 3 channels)."""
    from skimage import data

    image = data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(data, name)()
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def crop_16_9(image: np.ndarray) -> np.ndarray:
    height, width = image.shape[:2]
    if width * 9 > height * 16:
        keep = height * 16 // 9
        return image[:, (width - keep) // 2 : (width - keep) // 2 + keep]
    keep = width * 9 // 16
    return image[(height - keep) // 2 : (height - keep) // 2 + keep]


def write(path: Path, rgb: np.ndarray) -> None:
    options = [cv2.IMWRITE_JPEG_QUALITY, 90] if path.suffix == ".jpg" else []
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), options):
        raise SystemExit(f"could not write {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(PHOTOS):
        image = load(name)
        write(args.out / f"orig_{name}.{'png' if name in ('text', 'page') else 'jpg'}", image)
        frame = cv2.resize(crop_16_9(image), (1280, 720), interpolation=cv2.INTER_AREA)
        write(args.out / f"720_{name}.jpg", frame)
        if index < 3:
            write(args.out / f"720_{name}.png", frame)
        height, width = image.shape[:2]
        for longest in (640, 960, 1280, 1920):
            scale = longest / max(height, width)
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            write(args.out / f"mixed_{name}_{longest}.jpg", cv2.resize(image, size, interpolation=cv2.INTER_AREA))
    files = sorted(args.out.iterdir())
    print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
