import re

import pytest

from fastpath.config import parse_parameters, parse_sections
from fastpath.errors import ConfigError
from fastpath.models.text_detection.config import DetectionSchedulerConfig, TextDetectionConfig
from tests.conftest import MODEL_REPOSITORY


def test_defaults_are_paddleocr_and_rapidocr_values():
    config = parse_parameters(TextDetectionConfig, {})
    assert config.limit_side_len_px == 960
    assert (config.binary_threshold, config.box_threshold, config.unclip_ratio) == (0.3, 0.5, 1.6)
    assert config.max_image_pixels == 8192 * 8192
    assert config.use_dilation is True


def test_values_are_converted_by_type():
    config = parse_parameters(TextDetectionConfig, {"limit_side_len_px": "640", "use_dilation": "false", "box_threshold": "0.6"})
    assert (config.limit_side_len_px, config.use_dilation, config.box_threshold) == (640, False, 0.6)


def test_limit_type_and_largest_resized_pixels():
    assert parse_parameters(TextDetectionConfig, {}).limit_type == "max"
    assert parse_parameters(TextDetectionConfig, {}).largest_resized_pixels == 960 * 960
    config = parse_parameters(TextDetectionConfig, {"limit_type": "min", "limit_side_len_px": "736"})
    assert (config.limit_type, config.limit_side_len_px, config.largest_resized_pixels) == ("min", 736, 2048 * 1024)


def test_cpu_engine_options_carry_the_arena_bound_and_turn_the_memory_pattern_off():
    config = parse_parameters(TextDetectionConfig, {"arena_max_input_bytes": "1048576", "intra_op_threads": "2"})
    assert config.cpu_engine_options() == {"intra_op_threads": 2, "memory_pattern": False, "arena_max_input_bytes": 1 << 20}
    assert parse_parameters(TextDetectionConfig, {}).arena_max_input_bytes == 32 << 20


def test_gpu_engine_options_carry_the_graph_knobs_and_one_session_per_graph_is_off_by_default():
    config = parse_parameters(TextDetectionConfig, {"max_cuda_graphs": "15", "cuda_graph_session_per_shape": "true",
                                                    "cuda_eager_session_per_shape": "true", "cuda_intra_op_threads": "0",
                                                    "cuda_eager_options": "arena_extend_strategy=kSameAsRequested"})
    assert config.gpu_engine_options() == {"max_graphs": 15, "graph_after_runs": 0, "tf32": False, "session_per_graph": True,
                                           "eager_session_per_shape": True, "cuda_intra_op_threads": 0,
                                           "eager_options": {"arena_extend_strategy": "kSameAsRequested"}}
    defaults = parse_parameters(TextDetectionConfig, {}).gpu_engine_options()
    assert defaults["session_per_graph"] is False and defaults["eager_session_per_shape"] is False
    assert defaults["cuda_intra_op_threads"] == 1 and defaults["eager_options"] == {}
    for bad in ("-1", "65"):
        with pytest.raises(ConfigError, match=f"cuda_intra_op_threads.*{bad}.*in 0..64"):
            parse_parameters(TextDetectionConfig, {"cuda_intra_op_threads": bad})


def test_cuda_eager_options_are_name_value_pairs_and_a_malformed_one_is_named():
    """Each entry of cuda_eager_options is ``name=value`` (ONNX Runtime's CUDA EP option names; the engine refuses
    the options it sets itself); an entry without a name, an ``=`` or a value is a ConfigError naming it."""
    config = parse_parameters(TextDetectionConfig, {"cuda_eager_options": "arena_extend_strategy=kSameAsRequested,gpu_mem_limit=1024"})
    assert config.cuda_eager_option_map == {"arena_extend_strategy": "kSameAsRequested", "gpu_mem_limit": "1024"}
    for bad in ("arena_extend_strategy", "=1", "gpu_mem_limit="):
        with pytest.raises(ConfigError, match=f"cuda_eager_options.*{bad}.*name=value"):
            parse_parameters(TextDetectionConfig, {"cuda_eager_options": bad})


def test_opencv_threads_and_blocking_sync_parse_and_opencv_threads_is_bounded_to_0_64():
    config = parse_parameters(TextDetectionConfig, {"opencv_threads": "1", "cuda_blocking_sync": "true"})
    assert (config.opencv_threads, config.cuda_blocking_sync) == (1, True)
    defaults = parse_parameters(TextDetectionConfig, {})
    assert (defaults.opencv_threads, defaults.cuda_blocking_sync) == (0, False)  # OpenCV's and CUDA's own defaults
    for bad in ("-1", "65"):
        with pytest.raises(ConfigError, match=f"opencv_threads.*{bad}.*in 0..64"):
            parse_parameters(TextDetectionConfig, {"opencv_threads": bad})


def test_gpu_artifact_defaults_to_the_uint8_front_and_must_be_an_onnx_file_of_the_version_directory():
    """gpu_artifact names the CUDA engine's file inside the version directory: model.uint8.onnx unless set, any
    other .onnx file name accepted, and a path (either separator) or another extension rejected, naming the value."""
    assert parse_parameters(TextDetectionConfig, {}).gpu_artifact == "model.uint8.onnx"
    fp16 = parse_parameters(TextDetectionConfig, {"gpu_artifact": "model.uint8.fp16.range_backbone.onnx"})
    assert fp16.gpu_artifact == "model.uint8.fp16.range_backbone.onnx"
    for bad in ("../model.onnx", "sub\\model.onnx", "model.uint8.plan"):
        with pytest.raises(ConfigError, match="gpu_artifact.*ending in .onnx"):
            parse_parameters(TextDetectionConfig, {"gpu_artifact": bad})


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="'limit_side_len'.*known parameters:.*limit_side_len_px"):
        parse_parameters(TextDetectionConfig, {"limit_side_len": "960"})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("limit_side_len_px", "1000", "a multiple of 32"),
        ("limit_side_len_px", "0", "a multiple of 32"),
        ("max_image_pixels", "0", "> 0"),
        ("max_batch_images", "-1", "> 0"),
        ("binary_threshold", "1.5", r"in \(0, 1\)"),
        ("runtime", "tvm", "one of onnxruntime"),
        ("limit_type", "resize_long", "one of max, min"),
        ("limit_type", "MIN", "one of max, min"),
        ("limit_side_len_px", "-32", "a multiple of 32"),
        ("max_resized_pixels", "1023", ">= 1024"),
        ("arena_max_input_bytes", "-1", ">= 0 bytes"),
        ("staging_keep_idle_bytes", "-4096", ">= 0 bytes"),
        ("heap_trim_growth_bytes", "0", ">= 1 byte"),
    ],
)
def test_invalid_values_name_key_value_and_expectation(key, value, match):
    with pytest.raises(ConfigError, match=f"'{key}' = .*expected {match}"):
        parse_parameters(TextDetectionConfig, {key: value})


def test_shipped_config_pbtxt_parses():
    text = (MODEL_REPOSITORY / "text_detection" / "config.pbtxt").read_text()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))
    assert params, "no parameters found in config.pbtxt"
    config, sched = parse_sections(params, TextDetectionConfig, DetectionSchedulerConfig)
    assert config.max_images_per_request == 16
    assert (config.limit_type, config.limit_side_len_px, config.max_resized_pixels) == ("min", 736, 2048 * 1024)
    assert config.staging_capacity_bytes == 512 << 20
    assert (sched.batch_buckets, sched.max_queue_images, sched.max_queue_delay_us) == ((1, 2, 4, 8), 64, 2000)


def test_detection_scheduler_defaults_are_sized_for_images():
    sched = parse_parameters(DetectionSchedulerConfig, {})
    assert (sched.batch_buckets, sched.max_queue_images, sched.warmup) == ((1, 2, 4, 8), 64, True)
    with pytest.raises(ConfigError, match="'max_queue_images' = 4: expected >= the largest batch bucket"):
        parse_parameters(DetectionSchedulerConfig, {"max_queue_images": "4"})
    with pytest.raises(ConfigError, match="'staging_capacity_bytes' = 100: expected >= 4096"):
        parse_parameters(TextDetectionConfig, {"staging_capacity_bytes": "100"})
