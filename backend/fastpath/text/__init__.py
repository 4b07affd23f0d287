"""Text handling for text models: decoding request bytes and WordPiece tokenization."""

from fastpath.text.tokenize import EncodedBatch, TextTokenizer, decode_texts, set_tokenizer_parallelism

__all__ = ["EncodedBatch", "TextTokenizer", "decode_texts", "set_tokenizer_parallelism"]
