"""The ONNX Runtime CPU engine's memory options: calls above ``arena_max_input_bytes`` run without the arena."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fastpath.artifacts.detection import build_text_detection
from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
from fastpath.errors import EngineError

MIB = 1 << 20


@pytest.fixture(scope="module")
def detector_onnx(tmp_path_factory):
    """The real PP-OCRv4 detection artifact (dynamic batch, height and width)."""
    repository = tmp_path_factory.mktemp("repository")
    build_text_detection(repository)
    return str(repository / "text_detection" / "1" / "model.onnx")


def test_calls_above_the_bound_run_without_the_arena_and_give_the_same_maps(detector_onnx):
    """Invariants: a call whose input exceeds arena_max_input_bytes runs in the session without the arena
    (counted), smaller ones in the arena session; both give bit-identical outputs for the same input."""
    rng = np.random.default_rng(0)
    small = rng.random((1, 3, 64, 96), dtype=np.float32)  # 73,728 bytes
    large = rng.random((2, 3, 64, 96), dtype=np.float32)  # 147,456 bytes
    bounded = OnnxRuntimeEngine(detector_onnx, intra_op_threads=1, memory_pattern=False, arena_max_input_bytes=small.nbytes)
    arena_only = OnnxRuntimeEngine(detector_onnx, intra_op_threads=1, memory_pattern=False)
    try:
        (name,) = [spec.name for spec in bounded.inputs]
        bounded_small = bounded.infer({name: small})
        assert bounded.calls_without_arena == 0
        bounded_large = bounded.infer({name: large})
        assert bounded.calls_without_arena == 1
        for got, feed in ((bounded_small, small), (bounded_large, large)):
            expected = arena_only.infer({name: feed})
            for key, value in expected.items():
                np.testing.assert_array_equal(got[key], value)
        assert arena_only.calls_without_arena == 0
    finally:
        bounded.close()
        arena_only.close()
    with pytest.raises(EngineError, match="engine is closed"):
        bounded.infer({name: large})


def test_a_negative_bound_is_refused(detector_onnx):
    with pytest.raises(EngineError, match="arena_max_input_bytes must be >= 0 .* got -1"):
        OnnxRuntimeEngine(detector_onnx, arena_max_input_bytes=-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and uses glibc malloc_trim")
def test_memory_of_a_call_without_the_arena_goes_back_to_the_os(detector_onnx):
    """Real ONNX Runtime in fresh processes, one 2 x 736x736 call (12.4 MiB of input): with the arena the
    process keeps over 100 MiB after the call; run without the arena (bound 0) and with the freed heap
    trimmed, it keeps under 40 MiB."""
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from fastpath.engines.onnxruntime.engine import OnnxRuntimeEngine
        from fastpath.memory import release_freed_heap, resident_bytes
        bound = None if sys.argv[1] == "arena" else 0
        engine = OnnxRuntimeEngine({detector_onnx!r}, intra_op_threads=1, memory_pattern=False, arena_max_input_bytes=bound)
        name = engine.inputs[0].name
        engine.infer({{name: np.zeros((1, 3, 32, 32), np.float32)}})
        feed = np.full((2, 3, 736, 736), 0.5, np.float32)
        release_freed_heap()
        before = resident_bytes()
        engine.infer({{name: feed}})
        release_freed_heap()
        print(resident_bytes() - before)
    """)
    kept = {mode: int(subprocess.run([sys.executable, "-c", script, mode], check=True, capture_output=True,
                                     text=True).stdout) for mode in ("arena", "no-arena")}
    assert kept["arena"] > 100 * MIB, kept
    assert kept["no-arena"] < 40 * MIB, kept
