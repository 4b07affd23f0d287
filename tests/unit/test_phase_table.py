"""benchmarks/phases.py: the stubs' phase sums summed per model and divided by its requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import phases  # noqa: E402


def _write(directory: Path, instance: str, sums: dict[str, tuple[float, int]]) -> None:
    body = {"pid": 1, "phases": {phase: {"seconds": s, "count": c} for phase, (s, c) in sums.items()}, "counters": {}}
    (directory / f"{instance}.json").write_text(json.dumps(body))


def test_instances_sum_into_their_model_and_phases_divide_by_its_requests(tmp_path):
    """Invariants: instances <model>_<group>_<index> sum into <model>; a phase's µs per request is its summed
    seconds over the model's execute.total count (requests); calls is its summed count; models stay apart."""
    _write(tmp_path, "text_embedding_gpu_0_0", {"execute.total": (0.004, 3), "respond": (0.0003, 3), "run.stage": (0.0002, 1)})
    _write(tmp_path, "text_embedding_gpu_0_1", {"execute.total": (0.002, 1), "respond": (0.0001, 1)})
    _write(tmp_path, "stack_pad_embedding_0_0", {"execute.total": (0.001, 2), "respond": (0.0001, 2)})
    table = phases.per_model(tmp_path)
    ours = table["text_embedding_gpu"]
    assert ours["requests"] == 4
    assert ours["phases"]["respond"] == {"us_per_request": 100.0, "calls": 4}
    assert ours["phases"]["run.stage"] == {"us_per_request": 50.0, "calls": 1}
    assert table["stack_pad_embedding"]["phases"]["respond"]["us_per_request"] == 50.0
    text = phases.render(table)
    assert "run.stage" in text and "50.0 (1)" in text and "- (0)" in text  # a phase one model lacks shows as "-"


def test_a_file_that_is_no_phase_sum_is_refused_by_name(tmp_path):
    (tmp_path / "served.json").write_text('{"load": []}')
    with pytest.raises(ValueError, match=r"served.json: not a phase-profile sum"):
        phases.per_model(tmp_path)
    assert phases.model_of("text_embedding_12_3") == "text_embedding" and phases.model_of("odd") == "odd"
