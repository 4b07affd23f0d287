"""Benchmark baseline 'sync_detection' (see benchmarks/models/detection_baseline.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/models

from detection_baseline import BaselineDetectionModel  # noqa: E402


class TritonPythonModel(BaselineDetectionModel):
    device = "cpu"
