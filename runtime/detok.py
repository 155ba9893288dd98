"""Incremental detokenisation: the streamed pieces concatenate to ``decode(all tokens)``, in
time linear in the output length.

Two offsets into the generated ids (as in vLLM's incremental detokenizer): ``prefix`` starts a
short context window and ``read`` ends the part already emitted. Each update decodes only
``ids[prefix:]`` and ``ids[prefix:read]`` (the context gives a SentencePiece word its leading
space, and byte-level BPE its whole character); the new text is what the longer decode adds.
Text that ends in an incomplete UTF-8 sequence (U+FFFD) is held back until more tokens complete
it. Then the window slides (``prefix`` = the old ``read``), so each token is decoded a bounded
number of times. ``flush`` decodes the whole sequence once and emits whatever the window missed,
so the concatenation always equals the final full decode.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.sent = ""  # every piece emitted so far, concatenated
        self.prefix = 0  # ids[prefix:read]: the context window already emitted
        self.read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd") or not after.startswith(before):
            return ""  # nothing new yet, or an incomplete character: wait for more tokens
        piece = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.sent += piece
        return piece

    def flush(self) -> str:
        text = self._decode(self.ids)
        if text.startswith(self.sent):
            piece = text[len(self.sent):]
        else:  # a later token changed earlier text (rare merges): emit the correction honestly
            piece = text
        self.sent = text
        return piece
