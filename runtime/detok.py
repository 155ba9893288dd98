"""Incremental detokenisation: the streamed pieces concatenate to ``decode(all tokens)``.

Each update decodes the whole generated sequence and emits the new suffix, holding back text
that ends in an incomplete UTF-8 sequence (U+FFFD) until more tokens complete it. ``flush``
emits whatever remains, so the concatenation always equals the final full decode.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.sent = ""

    def _text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=self.skip)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self._text()
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def flush(self) -> str:
        text = self._text()
        if text.startswith(self.sent):
            piece = text[len(self.sent):]
        else:  # decoding changed earlier text (rare merges): emit the correction honestly
            piece = text
        self.sent = text
        return piece
