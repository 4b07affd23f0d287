import pytest

from fastpath.config import parse_parameters, triton_parameters
from fastpath.errors import ConfigError
from fastpath.models.text_embedding.config import TextEmbeddingConfig


def test_defaults_match_all_minilm():
    config = parse_parameters(TextEmbeddingConfig, {})
    assert config.runtime == "onnxruntime"
    assert config.max_seq_length == 256
    assert config.length_buckets_tokens == (16, 32, 64, 128, 256)


def test_values_are_converted_by_type():
    config = parse_parameters(
        TextEmbeddingConfig,
        {"intra_op_threads": " 2 ", "max_seq_length": "128", "length_buckets_tokens": "8, 16,128"},
    )
    assert config.intra_op_threads == 2
    assert config.max_seq_length == 128
    assert config.length_buckets_tokens == (8, 16, 128)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="'intra_op_thread'.*known parameters:.*intra_op_threads"):
        parse_parameters(TextEmbeddingConfig, {"intra_op_thread": "2"})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("runtime", "tensorflow", "one of onnxruntime"),
        ("intra_op_threads", "two", "not a valid int"),
        ("intra_op_threads", "-1", ">= 0"),
        ("max_seq_length", "1024", "2..512"),
        ("length_buckets_tokens", "64,32", "strictly increasing"),
        ("precision", "int4", "one of fp32"),
        ("cuda_sync", "poll", "blocking or spin"),
        ("tokenizer_parallelism", "maybe", "bool"),
        ("tokenizer_threads", "-2", ">= 0"),
        ("tokenizer_parallel_min_texts", "0", ">= 1"),
        ("concurrent_batches", "-1", ">= 0"),
    ],
)
def test_bad_values_name_key_and_value(key, value, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_parameters(TextEmbeddingConfig, {key: value})
    assert key in str(info.value)


def test_triton_parameters_from_model_config_json():
    config_json = '{"name": "m", "parameters": {"runtime": {"string_value": "onnxruntime"}, "max_seq_length": {"string_value": "64"}}}'
    assert triton_parameters(config_json) == {"runtime": "onnxruntime", "max_seq_length": "64"}
    assert triton_parameters({"name": "m"}) == {}


def test_concurrent_batches_resolve_to_engine_lanes(monkeypatch):
    """0 = 2 lanes on 2+ usable cores (1 on one core); threads split between lanes; only ONNX Runtime on the CPU."""
    from fastpath.models.text_embedding import pipeline as text_embedding

    monkeypatch.setattr(text_embedding, "process_cpus", lambda: 2)
    assert text_embedding.engine_lanes(TextEmbeddingConfig()) == (2, 1)
    assert text_embedding.engine_lanes(TextEmbeddingConfig(concurrent_batches=1)) == (0, 1)
    assert text_embedding.engine_lanes(TextEmbeddingConfig(concurrent_batches=3)) == (3, 1)
    monkeypatch.setattr(text_embedding, "process_cpus", lambda: 16)
    assert text_embedding.engine_lanes(TextEmbeddingConfig()) == (2, 8)
    assert text_embedding.engine_lanes(TextEmbeddingConfig(concurrent_batches=4, intra_op_threads=8)) == (4, 2)
    monkeypatch.setattr(text_embedding, "process_cpus", lambda: 1)
    assert text_embedding.engine_lanes(TextEmbeddingConfig()) == (0, 1)
    assert text_embedding.engine_lanes(TextEmbeddingConfig(runtime="torch", device="cuda")) == (0, 1)
    assert text_embedding.engine_options(TextEmbeddingConfig(concurrent_batches=2))["lanes"] == 2
    with pytest.raises(ConfigError, match="concurrent_batches.*0 or 1 unless runtime is onnxruntime on the cpu"):
        parse_parameters(TextEmbeddingConfig, {"runtime": "torch", "device": "cuda", "concurrent_batches": "2"})
