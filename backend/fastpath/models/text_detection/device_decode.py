"""JPEG decode and resize on the GPU (``decode_device cuda``): only the compressed bytes cross PCIe.

For a ``KIND_GPU`` ``text_detection`` instance whose config sets ``decode_device`` to ``cuda``:

    decode   each JPEG of ``IMAGE_BYTES`` with nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``)
             into uint8 RGB [3, H, W] on the device; PNG files, JPEGs without their end marker (cut
             short) and JPEGs nvJPEG refuses (CMYK, lossless, damaged) take the CPU decoder, which also
             gives a corrupt file its 400;
    resize   bilinear on the device to the same shape the CPU path picks (``resized_shape``),
             rounded half up, as ``cv2.resize`` rounds its fixed-point result; uint8 [h, w, 3];
    stage    a batch is laid out on the device by ``device_batches.stage_on_device`` (``stage_padded``'s
             layout) in uint8 [B, Hb, Wb, 3]; the engine copies it into its bound input buffer (device to device).

Each step leaves the device tensor ready (its stream synchronized), so the engine's own stream may read it.
The functions take a torch device, so the CPU build of torch runs them too (tests). The pixels differ a
little from the CPU path's (nvJPEG's IDCT and chroma upsampling, float resize): boxes are compared in
docs/benchmarks/detection_gpu_h200.md. Design: docs/design/text_detection.md#on-a-gpu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastpath.errors import ConfigError, InvalidInputError
from fastpath.models.text_detection.config import TextDetectionConfig
from fastpath.models.text_detection.image import BYTES_INPUT, SIGNATURES, decode_encoded
from fastpath.models.text_detection.pipeline import PreparedImage
from fastpath.models.text_detection.preprocess import resized_shape
from fastpath.models.text_detection.probe import ProbedRequest

JPEG_SIGNATURE = next(signature for signature, kind in SIGNATURES.items() if kind == "JPEG")
JPEG_END = b"\xff\xd9"  # EOI: a file cut short lacks it, and the CPU decoder refuses such a file (400)


def _torch() -> Any:
    import torch

    return torch


def resize_on_device(image_chw: Any, shape_hw: tuple[int, int]) -> Any:
    """Bilinear resize of uint8 [3, H, W] (a torch tensor) to uint8 [h, w, 3], contiguous, on its device.

    Half-pixel centres and no antialiasing, as ``cv2.resize(..., INTER_LINEAR)``; values rounded half up.
    """
    torch = _torch()
    height, width = shape_hw
    if tuple(image_chw.shape[1:]) == (height, width):
        return image_chw.permute(1, 2, 0).contiguous()
    scaled = torch.nn.functional.interpolate(image_chw[None].float(), size=(height, width), mode="bilinear",
                                             align_corners=False, antialias=False)[0]
    return scaled.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()


def prepare_on_device(image_chw: Any, config: TextDetectionConfig) -> PreparedImage:
    """uint8 RGB [3, H, W] on the device -> a :class:`PreparedImage` whose ``resized`` is uint8 [h, w, 3] there,
    (h, w) chosen exactly as on the CPU (:func:`~fastpath.models.text_detection.preprocess.resized_shape`)."""
    height, width = (int(side) for side in image_chw.shape[1:])
    shape = resized_shape(height, width, config.limit_side_len_px, config.limit_type, config.max_resized_pixels)
    resized = resize_on_device(image_chw, shape)
    synchronize(resized)
    return PreparedImage(resized, (height, width))


def synchronize(tensor: Any) -> None:
    """Wait for the work queued on ``tensor``'s device by this thread's current stream (nothing on a CPU tensor)."""
    if tensor.is_cuda:
        _torch().cuda.current_stream(tensor.device).synchronize()


class DeviceJpegDecoder:
    """nvJPEG through torchvision, for one GPU.

    Args:
        device: ``cuda`` or ``cuda:N`` (the instance's GPU).

    Raises:
        ConfigError: torch or torchvision is missing, or a test JPEG does not decode on ``device``
            (the message says what to install or to set ``decode_device`` to ``cpu``).
    """

    def __init__(self, device: str) -> None:
        try:
            import torch
            from torchvision.io import ImageReadMode, decode_jpeg
        except Exception as exc:  # ImportError, or torchvision built for another torch
            raise ConfigError(f"config.pbtxt parameter 'decode_device' = cuda needs torch and torchvision with CUDA "
                              f"({type(exc).__name__}: {exc}); install them or set decode_device to cpu") from exc
        self.device = torch.device(device)
        self._decode_jpeg, self._mode, self._torch = decode_jpeg, ImageReadMode.RGB, torch
        import cv2

        ok, sample = cv2.imencode(".jpg", np.full((16, 24, 3), 128, np.uint8))
        try:
            decoded = self.decode(sample.tobytes())
        except Exception as exc:
            raise ConfigError(f"config.pbtxt parameter 'decode_device' = cuda: nvJPEG could not decode a test JPEG on "
                              f"{device} ({exc}); set decode_device to cpu") from exc
        if tuple(decoded.shape) != (3, 16, 24):
            raise ConfigError(f"nvJPEG decoded a 16x24 test JPEG to {list(decoded.shape)}; set decode_device to cpu")

    def decode(self, data: bytes) -> Any:
        """One JPEG file -> uint8 RGB [3, H, W] on the device (EXIF orientation not applied, as on the CPU).

        Raises:
            RuntimeError: nvJPEG refused the file (the caller falls back to the CPU decoder).
        """
        encoded = self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8)
        return self._decode_jpeg(encoded, mode=self._mode, device=self.device)

    def images(self, probed: ProbedRequest) -> list[Any]:
        """The request's images: JPEGs as device tensors uint8 [3, H, W], the rest as numpy uint8 RGB [H, W, 3].

        ``probed`` comes from :func:`~fastpath.models.text_detection.probe.probe_request`.

        Raises:
            InvalidInputError: naming every bad element: a header that could not be read, a corrupt file (the CPU
                decoder's message), or one that decodes to another size than its header.
        """
        return probed.decode_each(self._image)

    def _image(self, index: int, data: bytes, size: tuple[int, int]) -> Any:
        """One element of :meth:`images`: nvJPEG for a JPEG it takes, else the CPU decoder."""
        image = None
        if data.startswith(JPEG_SIGNATURE) and data.endswith(JPEG_END):
            try:
                image = self.decode(data)
            except RuntimeError:  # CMYK, lossless or damaged: the CPU decoder decodes it or says what is wrong
                image = None
            if image is not None and tuple(image.shape[1:]) != tuple(size):
                raise InvalidInputError(f"input {BYTES_INPUT} element {index} decoded to {image.shape[1]}x{image.shape[2]} "
                                        f"pixels but its header says {size[0]}x{size[1]}; the file is corrupt")
        return image if image is not None else decode_encoded(data, index=index, expected_hw=size)
