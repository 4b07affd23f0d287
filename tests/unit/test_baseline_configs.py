"""The detection baselines (benchmarks/models) resize and post-process as the served text_detection does:
a benchmark that compares their boxes or their speed with FastPath's is comparing the same work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastpath.cli.common import DEFAULT_REPOSITORY

BASELINES = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
SAME_WORK = ("limit_type", "limit_side_len_px", "max_resized_pixels", "binary_threshold", "box_threshold",
             "unclip_ratio", "max_candidates", "use_dilation", "min_box_side_px", "precision")


def parameters(path: Path) -> dict[str, str]:
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', path.read_text()))


@pytest.mark.parametrize("baseline", ["sync_detection", "naive_detection"])
def test_a_detection_baseline_does_the_served_models_work(baseline):
    """Invariant: every resize and DB post-processing parameter the served config sets, the baseline sets alike
    (an unset key takes TextDetectionConfig's default on both sides)."""
    served = parameters(DEFAULT_REPOSITORY / "text_detection" / "config.pbtxt")
    theirs = parameters(BASELINES / baseline / "config.pbtxt")
    assert {k: theirs.get(k) for k in SAME_WORK} == {k: served.get(k) for k in SAME_WORK}
