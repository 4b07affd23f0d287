"""Benchmark baseline 'floor_embedding' (see benchmarks/models/baseline.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/models

from baseline import BaselineEmbeddingModel  # noqa: E402


class TritonPythonModel(BaselineEmbeddingModel):
    mode = "floor"
