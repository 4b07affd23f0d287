"""Image handling for vision models: request decoding, detector pre-processing, DB post-processing."""

from fastpath.vision.config import TextDetectionConfig

__all__ = ["TextDetectionConfig"]
