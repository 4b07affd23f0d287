"""Engine.infer checks feeds and results in one place, the same for every runtime.

Invariants, on the onnxruntime runtime and on a second, numpy runtime (tests/unit/engines/onnx_reference):
* every input the engine declares is fed, or the call fails naming the missing input, what was fed and
  what was expected, before the runtime runs;
* every input has a batch dimension first and all share one batch size, or the call fails naming the
  tensor and both sizes;
* every output keeps the input's batch size, or the call fails naming the output, its shape and the
  batch size (a graph that averages over the batch breaks the contract);
* feeds the engine does not take are ignored; lanes are checked the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastpath.engines
from fastpath.engines import load_engine, register_runtime
from fastpath.errors import EngineError
from tests.unit.engines.tiny_graphs import batch_mean, masked

RUNTIMES = {"onnxruntime": {"intra_op_threads": 1}, "onnx-reference": {}}


@pytest.fixture(params=sorted(RUNTIMES))
def runtime(request, monkeypatch):
    """A runtime name; the numpy runtime registered for this test only."""
    monkeypatch.setattr(fastpath.engines, "_REGISTRY", dict(fastpath.engines._REGISTRY))
    register_runtime("onnx-reference", "tests.unit.engines.onnx_reference.loader")
    return request.param


@pytest.fixture
def masked_engine(runtime, tmp_path):
    with load_engine(runtime, str(masked(tmp_path / "masked.onnx")), **RUNTIMES[runtime]) as engine:
        yield engine


def test_a_checked_batch_runs_and_extra_feeds_are_ignored(masked_engine):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    mask = np.array([[1, 0, 1, 0]] * 3, dtype=np.float32)
    out = masked_engine.infer({"x": x, "mask": mask, "unused": np.zeros(7)})
    np.testing.assert_array_equal(out["y"], x * mask)


def test_a_missing_input_is_named_with_what_was_fed(masked_engine):
    with pytest.raises(EngineError, match=rf"{masked_engine.name} engine: input 'mask' is missing; got \['x'\], expected \['x', 'mask'\]"):
        masked_engine.infer({"x": np.ones((2, 4), np.float32)})


@pytest.mark.parametrize(("value", "got"), [(np.float32(1.0), r"an array of shape \(\)"), ([[1.0] * 4], "a list")])
def test_an_input_without_a_batch_dimension_is_named(masked_engine, value, got):
    with pytest.raises(EngineError, match=rf"input 'x' is {got}; expected an array with the batch dimension first"):
        masked_engine.infer({"x": value, "mask": np.ones((1, 4), np.float32)})


def test_inputs_of_different_batch_sizes_are_named_with_both_sizes(masked_engine):
    with pytest.raises(EngineError, match="input 'mask' has batch size 2, input 'x' has 3; expected every input with the same batch size"):
        masked_engine.infer({"x": np.ones((3, 4), np.float32), "mask": np.ones((2, 4), np.float32)})


def test_an_output_that_loses_the_batch_size_is_refused(runtime, tmp_path):
    with load_engine(runtime, str(batch_mean(tmp_path / "mean.onnx")), **RUNTIMES[runtime]) as engine:
        x = np.ones((4, 4), np.float32)
        with pytest.raises(EngineError, match=r"returned output 'y' as an array of shape \(1, 4\) for a batch of 4; "
                                              r"expected 4 rows first \(the batch size is not preserved\)"):
            engine.infer({"x": x})
        assert engine.infer({"x": x[:1]})["y"].shape == (1, 4)  # one row in, one row out: within the contract


def test_lanes_are_checked_like_infer(tmp_path):
    with load_engine("onnxruntime", str(masked(tmp_path / "masked.onnx")), lanes=1, lane_threads=1) as engine:
        x = np.full((2, 4), 3, np.float32)
        np.testing.assert_array_equal(engine.infer_lane({"x": x, "mask": np.ones_like(x)}, 0)["y"], x)
        with pytest.raises(EngineError, match="input 'mask' is missing"):
            engine.infer_lane({"x": x}, 0)
        with pytest.raises(EngineError, match="onnxruntime engine has 1 lanes; lane 1 does not exist"):
            engine.infer_lane({"x": x, "mask": x}, 1)


def test_a_closed_engine_says_so_before_looking_at_feeds(runtime, tmp_path):
    engine = load_engine(runtime, str(masked(tmp_path / "masked.onnx")), **RUNTIMES[runtime])
    engine.close()
    engine.close()  # idempotent
    assert engine.closed
    with pytest.raises(EngineError, match=f"{engine.name} engine is closed; load the artifact again"):
        engine.infer({})
