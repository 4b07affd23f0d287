import numpy as np
import pytest

from fastpath.errors import InvalidInputError
from fastpath.models.text_embedding.pipeline import padded_length, plan_batches
from fastpath.text import TextTokenizer, decode_texts
from tests.conftest import MODEL_REPOSITORY

TOKENIZER = MODEL_REPOSITORY / "text_embedding" / "1" / "tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer(TOKENIZER, max_seq_length=256)


# unicode, NUL and control characters: ids from the reference fast tokenizer
@pytest.mark.parametrize(
    ("text", "ids"),
    [
        (" 😃 hello how are you", [101, 100, 7592, 2129, 2024, 2017, 102]),
        ("🥱", [101, 100, 102]),
        ("的人有", [101, 1916, 1756, 1873, 102]),
        ("\x00abc", [101, 5925, 102]),
        ("\ufffd", [101, 102]),
        ("", [101, 102]),
        ("   ", [101, 102]),
        ("\t\n", [101, 102]),
    ],
)
def test_token_ids_match_reference(tokenizer, text, ids):
    assert tokenizer.encode([text])[0].ids == ids


def test_naive_cafe_is_lowercased_and_stripped(tokenizer):
    """[CLS] naive cafe [SEP] (the reference tokenizer's ids): accents stripped, lowercased."""
    assert tokenizer.encode(["naïve café"])[0].ids == tokenizer.encode(["naive cafe"])[0].ids == [101, 15743, 7668, 102]


def test_truncation_is_256_not_the_files_128(tokenizer):
    """The shipped tokenizer.json truncates at 128 and pads to 128; sentence-transformers uses 256."""
    encoding = tokenizer.encode(["word " * 400])[0]
    assert len(encoding.ids) == 256
    assert encoding.ids[-1] == 102
    assert len(encoding.overflowing) > 0
    short = tokenizer.encode(["hello world"])[0]
    assert short.ids == [101, 7592, 2088, 102]  # no padding to 128


def test_pad_builds_masks(tokenizer):
    batch = tokenizer.pad(tokenizer.encode(["hello world", ""]), 8)
    assert batch.input_ids.dtype == np.int64 and batch.input_ids.shape == (2, 8)
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert not batch.token_type_ids.any()


def test_decode_rejects_invalid_utf8_naming_tensor_and_byte():
    values = np.array([[b"ok"], [b"\xff\xfe\xfd"]], dtype=object)
    with pytest.raises(InvalidInputError, match=r"TEXT\[1\] is not valid UTF-8: byte 0xff at offset 0"):
        decode_texts(values, tensor="TEXT", max_text_bytes=100)


def test_decode_keeps_nul_and_enforces_size_limit():
    assert decode_texts(np.array([[b"abc\x00"]], dtype=object), tensor="TEXT", max_text_bytes=10) == ["abc\x00"]
    with pytest.raises(InvalidInputError, match=r"TEXT\[0\] is 11 bytes; the limit is 10 bytes"):
        decode_texts(np.array([[b"x" * 11]], dtype=object), tensor="TEXT", max_text_bytes=10)


def test_padded_length_snaps_to_bucket():
    buckets = (16, 32, 64, 128, 256)
    assert padded_length(2, buckets, 256) == 16
    assert padded_length(16, buckets, 256) == 16
    assert padded_length(17, buckets, 256) == 32
    assert padded_length(256, buckets, 256) == 256
    assert padded_length(100, (16, 32), 256) == 100  # no bucket holds it: pad to the longest only


def test_plan_batches_sorts_by_length_and_covers_every_index():
    lengths = [30, 5, 200, 5, 17, 64, 9]
    batches = plan_batches(lengths, 3)
    assert [[lengths[i] for i in b] for b in batches] == [[5, 5, 9], [17, 30, 64], [200]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))


def test_pad_into_given_arrays_equals_a_fresh_pad_and_overwrites_stale_data(tokenizer):
    """pad(out=...) fills views of a staging block in place: every element is written."""
    encodings = tokenizer.encode(["short", "a somewhat longer sentence to pad", ""])
    fresh = tokenizer.pad(encodings, 16)
    block = np.full(3 * 3 * 16, 7, dtype=np.int64)  # stale data from an earlier batch
    views = [block[k * 48 : (k + 1) * 48].reshape(3, 16) for k in range(3)]
    from fastpath.text import EncodedBatch

    filled = tokenizer.pad(encodings, 16, out=EncodedBatch(*views))
    for name, array in fresh.feeds().items():
        np.testing.assert_array_equal(filled.feeds()[name], array)
        assert np.shares_memory(filled.feeds()[name], block)
    with pytest.raises(ValueError, match=r"int64 arrays of shape \(3, 16\)"):
        tokenizer.pad(encodings, 16, out=EncodedBatch(*[v[:, :8] for v in views]))


def test_long_texts_are_tokenized_from_a_word_prefix_with_identical_results(tokenizer):
    """A 1 MiB text costs a prefix's tokenization, and every kind of long text encodes exactly as
    the whole text does (ids and the truncation flag)."""
    from tokenizers import Tokenizer

    whole = Tokenizer.from_file(str(MODEL_REPOSITORY / "text_embedding" / "1" / "tokenizer.json"))
    whole.no_padding()
    whole.enable_truncation(max_length=256)
    sentence = "Sentence embeddings map text to vectors; FastPath serves them through Triton. "
    texts = [
        sentence * 14_000,  # ~1 MiB of real words: the prefix overflows, whole text never tokenized
        "a" + " " * 40_000 + "b c d",  # few tokens in many characters: prefix does not overflow, redo
        "x" * 50_000,  # one giant word, no whitespace to cut at
        "word\t" * 5_000 + "tail",  # tab-separated
        "café naïve résumé " * 3_000,  # accents stripped per character
        "short text",
    ]
    ours = tokenizer.encode(texts)
    references = [whole.encode(text, add_special_tokens=True) for text in texts]
    for encoding, reference in zip(ours, references):
        assert encoding.ids == reference.ids
        assert bool(encoding.overflowing) == bool(reference.overflowing)
    # the 1 MiB text was tokenized from a ~16k-character prefix: a few overflow windows, not ~900
    assert len(ours[0].overflowing) < 20 < 500 < len(references[0].overflowing)


def test_tokenizer_parallelism_is_set_for_the_process_and_gives_the_same_ids(tokenizer, monkeypatch):
    import os

    from fastpath.text import set_tokenizer_parallelism

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    texts = ["a first sentence", "and a second, somewhat longer sentence"] * 8
    parallel = [e.ids for e in tokenizer.encode(texts)]
    set_tokenizer_parallelism(False)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert [e.ids for e in tokenizer.encode(texts)] == parallel


def test_a_call_can_choose_its_own_parallelism_with_the_same_ids(tokenizer, monkeypatch):
    """encode(parallel=...) sets TOKENIZERS_PARALLELISM for that call (tokenizers reads it per batch
    call); the ids do not depend on it."""
    import os

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    texts = ["a first sentence", "and a second, somewhat longer sentence", "x" * 3000] * 12
    sequential = [e.ids for e in tokenizer.encode(texts, parallel=False)]
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert [e.ids for e in tokenizer.encode(texts, parallel=True)] == sequential
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    tokenizer.encode(texts[:1])  # None leaves the setting alone
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_encode_skips_offsets_yet_returns_what_encode_batch_does(tokenizer):
    """TextTokenizer.encode runs tokenizers' encode_batch_fast (no character offsets, no token strings): for
    sentences, a truncated text and accented words the ids, attention and special-tokens masks, type ids and
    overflow windows equal encode_batch's under the same truncation; the offsets it skipped are all zero."""
    from tokenizers import Tokenizer

    from fastpath.text.corpus import pydoc_sentences

    reference = Tokenizer.from_file(str(TOKENIZER))
    reference.no_padding()
    reference.enable_truncation(max_length=256)
    texts = pydoc_sentences()[:200] + ["word " * 400, "naïve café", ""]
    for ours, theirs in zip(tokenizer.encode(texts), reference.encode_batch(texts, add_special_tokens=True)):
        assert (ours.ids, ours.attention_mask, ours.special_tokens_mask, ours.type_ids) == \
            (theirs.ids, theirs.attention_mask, theirs.special_tokens_mask, theirs.type_ids)
        assert [o.ids for o in ours.overflowing] == [o.ids for o in theirs.overflowing]
        assert all(offset == (0, 0) for offset in ours.offsets)
