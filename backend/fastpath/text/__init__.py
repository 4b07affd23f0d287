"""Text handling for text models: decoding request bytes and WordPiece tokenization."""

from fastpath.text.tokenize import EncodedBatch, TextTokenizer, decode_texts

__all__ = ["EncodedBatch", "TextTokenizer", "decode_texts"]
