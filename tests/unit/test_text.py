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


def test_decode_names_an_encoded_utf16_surrogate_as_such():
    """A surrogate encoded in three bytes (what a JSON string holding a lone \\udcff becomes) is named as the
    surrogate, not as the 'invalid continuation byte' Python's decoder reports at its valid lead byte 0xED; a
    str element carrying one (surrogatepass) is refused the same way."""
    values = np.array([[b"ok"], [b"x\xed\xb3\xbfy"]], dtype=object)
    message = r"TEXT\[1\] is not valid UTF-8: bytes ed b3 bf at offset 1 encode the UTF-16 surrogate U\+DCFF, which UTF-8 excludes"
    with pytest.raises(InvalidInputError, match=message):
        decode_texts(values, tensor="TEXT", max_text_bytes=100)
    with pytest.raises(InvalidInputError, match=r"TEXT\[0\] is not valid UTF-8: bytes ed a0 80 at offset 0 encode the UTF-16 surrogate U\+D800"):
        decode_texts(np.array(["\ud800"], dtype=object), tensor="TEXT", max_text_bytes=100)
    with pytest.raises(InvalidInputError, match=r"byte 0xed at offset 0 \(invalid continuation byte\)"):
        decode_texts(np.array([b"\xed\x41\x41"], dtype=object), tensor="TEXT", max_text_bytes=100)  # not a surrogate


def test_decode_names_every_bad_element_of_a_batch():
    """Invariant: one error names each bad element of the tensor (the first five, in order, then a count of
    the rest), so a client fixes a batch in one round trip instead of one per bad text."""
    values = np.array([b"ok", b"\xff", b"x" * 11, b"fine", 7, b"\xfe"], dtype=object)
    with pytest.raises(InvalidInputError) as info:
        decode_texts(values, tensor="TEXT", max_text_bytes=10)
    message = str(info.value)
    assert [part.split(" ")[0] for part in message.split("; ") if part.startswith("TEXT[")] == \
        ["TEXT[1]", "TEXT[2]", "TEXT[4]", "TEXT[5]"]
    assert "TEXT[2] is 11 bytes" in message and "TEXT[4] has type int" in message and "more bad" not in message
    with pytest.raises(InvalidInputError, match=r"TEXT\[0\] is not valid UTF-8.*TEXT\[4\] .*; and 3 more bad elements of TEXT$"):
        decode_texts(np.array([b"\xff"] * 8, dtype=object), tensor="TEXT", max_text_bytes=10)


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
        "!?" * (1 << 17),  # 256 KiB of punctuation: every character a token, no whitespace to cut at
        "漢字テスト、" * 40_000,  # CJK without spaces: ideographs and 、 are split points
        "mot\u00a0" * 5_000,  # no-break spaces, normalized to spaces
        ("x" * 200 + " ") * 5_000,  # [UNK] words: a 16k-character prefix has 81 tokens, so a longer prefix is tried
        "short text",
    ]
    ours = tokenizer.encode(texts)
    references = [whole.encode(text, add_special_tokens=True) for text in texts]
    for encoding, reference in zip(ours, references):
        assert encoding.ids == reference.ids
        assert bool(encoding.overflowing) == bool(reference.overflowing)
    # the 1 MiB text was tokenized from a ~16k-character prefix: a few overflow windows, not ~900; and so was
    # the punctuation text (every character a token: ~1,000 windows for the whole text)
    assert len(ours[0].overflowing) < 20 < 500 < len(references[0].overflowing)
    assert len(ours[6].overflowing) < 70 < 500 < len(references[6].overflowing)


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


# Characters a user's text may carry, for the prefix property below: letters, accents as separate combining marks,
# case pairs that lowercase specially, kana, digits, control and format characters (removed by BERT's normalizer,
# so they join what surrounds them), every kind of split point, and whitespace that BERT treats otherwise.
WORD_CHARS = "abcXYZ09éüßΣİテス\u0301\u0308\x00\x0b\x0c\u200b\ufffd"
SPLIT_CHARS = " \t\n\r!?.,;:'\"-_/\\+=<>()[]{}@#$%^&*`|~\u00a0\u3000、。，！？「」—…漢字"
REAL_WORDS = ["to", "ken", "token", "s", "in", "serve", "r", "the", "m", "embed", "ding", "café", "Σ", "漢", "テスト"]
OTHER_SPACES = "\u2003\u2028\x1c\x85"


def _texts():
    from hypothesis import strategies as st

    # real words, whose joins are other words ("to" + "ken", "serve" + "r"), and random ones up to WordPiece's limit
    word = st.one_of(st.sampled_from(REAL_WORDS), st.text(alphabet=WORD_CHARS, min_size=1, max_size=140))
    gap = st.one_of(st.text(alphabet=SPLIT_CHARS, min_size=1, max_size=3), st.text(alphabet=OTHER_SPACES, min_size=1, max_size=2))
    return st.lists(st.tuples(word, gap), min_size=1, max_size=40).map(lambda parts: "".join(w + g for w, g in parts))


def test_a_prefix_cut_at_a_split_point_has_the_first_tokens_of_the_whole_text():
    """Invariant: for any text, a prefix cut at any of its split points (``_split_prefix`` at that limit: the
    tokenizer encodes such a prefix in place of a long text) tokenizes, without truncation, to exactly the first
    tokens of the whole text: no split point joins or splits a word that the whole text tokenizes otherwise."""
    from hypothesis import given, settings
    from tokenizers import Tokenizer

    from fastpath.text.tokenize import _SPLIT_AT, _split_prefix

    plain = Tokenizer.from_file(str(TOKENIZER))
    plain.no_padding()
    plain.no_truncation()

    @settings(max_examples=150, deadline=None)
    @given(_texts())
    def check(value: str) -> None:
        whole = plain.encode(value, add_special_tokens=False).ids
        for split in _SPLIT_AT.finditer(value):
            prefix = _split_prefix(value, split.start())
            if prefix is not None:
                assert len(prefix) <= split.start()
                head = plain.encode(prefix, add_special_tokens=False).ids
                assert whole[: len(head)] == head, (prefix[-20:], value[len(prefix) : len(prefix) + 20])

    check()


def test_any_text_encodes_as_the_whole_text_does_under_truncation():
    """Invariant: the tokenizer's result (ids and whether it was truncated) equals the whole text's encoding under
    the same truncation, whatever the text's mix of words, split points and other characters; a small
    max_seq_length makes the prefix limit (8 tokens x 64 characters) short enough to cross often."""
    from hypothesis import given, settings
    from tokenizers import Tokenizer

    ours = TextTokenizer(TOKENIZER, max_seq_length=8)
    whole = Tokenizer.from_file(str(TOKENIZER))
    whole.no_padding()
    whole.enable_truncation(max_length=8)

    @settings(max_examples=200, deadline=None)
    @given(_texts())
    def check(value: str) -> None:
        encoding, reference = ours.encode([value])[0], whole.encode(value, add_special_tokens=True)
        assert encoding.ids == reference.ids
        assert bool(encoding.overflowing) == bool(reference.overflowing)

    check()
