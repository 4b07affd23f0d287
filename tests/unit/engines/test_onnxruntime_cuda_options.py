"""Session options of the CUDA image engine (fastpath.engines.onnxruntime.image_cuda), checked without a GPU.

Invariants:
* the graph-free session picks convolution algorithms by cuDNN's heuristic and graph sessions keep ONNX Runtime's
  default search with ``enable_cuda_graph`` on; both carry the device and the TF32 flag;
* extra options go on top of those defaults, and the options the engine owns (device, TF32, graphs) are refused by name;
* text_detection's GPU knobs (graphs, TF32, one session per graph, CPU threads) reach ``load_engine`` unchanged, and the
  onnxruntime loader takes them for the images layout: without onnxruntime-gpu the call fails on the missing CUDA EP,
  not on them;
* a CUDA EP session has one CPU thread and no spinning by default (no worker busy-waits beside a GPU model); more
  threads, or 0 (one per CPU), keep ONNX Runtime's spinning.
"""

from __future__ import annotations

import dataclasses

import onnxruntime
import pytest

import fastpath.models.text_detection.pipeline as pipeline
from fastpath.engines import load_engine
from fastpath.engines.onnxruntime.cuda_graphs import cuda_session_options
from fastpath.engines.onnxruntime.image_cuda import ENGINE_OWNED_OPTIONS, cuda_provider_options
from fastpath.errors import EngineError
from fastpath.models.text_detection.config import UINT8_ARTIFACT, TextDetectionConfig
from tests.conftest import MODEL_REPOSITORY

VERSION_DIR = MODEL_REPOSITORY / "text_detection" / "1"
NO_CUDA_EP = "CUDAExecutionProvider" not in onnxruntime.get_available_providers()


def test_graph_free_sessions_use_the_heuristic_and_graph_sessions_the_default_search():
    assert cuda_provider_options(1, tf32=False, graphs=False) == {
        "device_id": "1", "use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}
    assert cuda_provider_options(0, tf32=True, graphs=True) == {"device_id": "0", "use_tf32": "1", "enable_cuda_graph": "1"}


def test_extra_options_go_on_top_of_the_defaults():
    eager = cuda_provider_options(0, tf32=False, graphs=False, extra={"cudnn_conv_algo_search": "EXHAUSTIVE",
                                                                      "cudnn_conv_use_max_workspace": "0"})
    assert eager["cudnn_conv_algo_search"] == "EXHAUSTIVE" and eager["cudnn_conv_use_max_workspace"] == "0"
    graphs = cuda_provider_options(0, tf32=False, graphs=True, extra={"arena_extend_strategy": "kSameAsRequested"})
    assert graphs == {"device_id": "0", "use_tf32": "0", "enable_cuda_graph": "1", "arena_extend_strategy": "kSameAsRequested"}


@pytest.mark.parametrize("key", ENGINE_OWNED_OPTIONS)
def test_options_the_engine_owns_are_refused_by_name(key):
    with pytest.raises(EngineError, match=f"CUDA EP option {key}='1' cannot be set here: the engine sets device_id"):
        cuda_provider_options(0, tf32=False, graphs=True, extra={key: "1"})


def test_option_values_must_be_strings():
    with pytest.raises(EngineError, match="cudnn_conv_use_max_workspace=0 cannot be set here.*values are strings"):
        cuda_provider_options(0, tf32=False, graphs=False, extra={"cudnn_conv_use_max_workspace": 0})


def test_the_gpu_knobs_of_the_config_reach_load_engine(monkeypatch):
    """TextDetector.from_directory on a GPU passes the config's graph, TF32 and session-per-graph knobs to load_engine
    (spied with the real function behind it, which then fails here for want of onnxruntime-gpu)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return load_engine(*args, **kwargs)

    monkeypatch.setattr(pipeline, "load_engine", spy)
    config = TextDetectionConfig(max_cuda_graphs=15, cuda_graph_after_runs=3, cuda_tf32=True, cuda_graph_session_per_shape=True,
                                 cuda_eager_session_per_shape=True, cuda_intra_op_threads=2,
                                 cuda_eager_options=("arena_extend_strategy=kSameAsRequested",))
    if NO_CUDA_EP:
        with pytest.raises(EngineError, match="no CUDAExecutionProvider"):
            pipeline.TextDetector.from_directory(VERSION_DIR, config, device="cuda:0", batch_sizes=(1, 2))
    else:
        pipeline.TextDetector.from_directory(VERSION_DIR, config, device="cuda:0", batch_sizes=(1, 2)).close()
    (kwargs,) = calls
    assert kwargs == {"device": "cuda:0", "layout": "images", "batch_sizes": (1, 2), "max_graphs": 15, "graph_after_runs": 3,
                      "tf32": True, "session_per_graph": True, "eager_session_per_shape": True, "cuda_intra_op_threads": 2,
                      "eager_options": {"arena_extend_strategy": "kSameAsRequested"}}
    assert dataclasses.replace(config, cuda_graph_session_per_shape=False).gpu_engine_options()["session_per_graph"] is False
    assert TextDetectionConfig().gpu_engine_options()["eager_session_per_shape"] is False
    assert TextDetectionConfig().gpu_engine_options()["cuda_intra_op_threads"] == 1


def test_a_cuda_session_has_one_cpu_thread_and_no_spinning_by_default():
    default = cuda_session_options()
    assert default.intra_op_num_threads == 1
    assert default.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert default.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    pool = cuda_session_options(4)
    assert pool.intra_op_num_threads == 4 and pool.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert cuda_session_options(0).get_session_config_entry("session.intra_op.allow_spinning") == "1"
    with pytest.raises(ValueError, match="intra_op_threads must be >= 0, got -1"):
        cuda_session_options(-1)


@pytest.mark.skipif(not NO_CUDA_EP, reason="onnxruntime-gpu is installed here: tests/gpu builds the engine with these options")
def test_the_loader_takes_the_session_options_for_images():
    with pytest.raises(EngineError, match="no CUDAExecutionProvider .* install onnxruntime-gpu"):
        load_engine("onnxruntime", str(VERSION_DIR / UINT8_ARTIFACT), device="cuda:0", layout="images", session_per_graph=True, eager_session_per_shape=True,
                    cuda_intra_op_threads=0,
                    eager_options={"cudnn_conv_algo_search": "DEFAULT"}, graph_options={"arena_extend_strategy": "kSameAsRequested"})
