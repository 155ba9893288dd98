"""Committed tokens → streamed text pieces, with OpenAI stop strings: :class:`TextStream`.

    push(ids)      detokenize a round's tokens; returns True once a stop string appeared
    finish()       flush the detokenizer and send the rest; True if a stop string ended it
    text_sent      what the client has received (the completion's text after a stop)

A piece is sent as soon as it cannot be the start of a stop string (the last ``max(len(stop)) - 1``
characters are held back). Scored tokens (log-probabilities asked for) travel with the piece their
text starts in; the tokens a stop string cuts off are never sent, nor are their scores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rapid.runtime.detok import Detokenizer
from rapid.runtime.openai_logprobs import TokenLogprob
from rapid.runtime.token_scores import TokenScore


@dataclass(slots=True, frozen=True)
class Piece:
    """A streamed piece of text and the scored tokens whose text starts in it."""

    text: str
    logprobs: list[TokenLogprob]


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str], pieces: asyncio.Queue,
                 on_first_text: Callable[[], None] | None = None) -> None:
        self.detok = Detokenizer(tokenizer)
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pieces = pieces  # Piece objects (the caller puts the final None)
        self.on_first_text = on_first_text
        self.full, self.sent = "", 0
        self.scored: list[TokenScore] = []  # scores of the tokens push() gets next (they arrive first)
        self.unsent: list[TokenLogprob] = []  # scored tokens not streamed yet, by offset
        self.logprobs: list[TokenLogprob] = []  # of the tokens sent

    @property
    def text_sent(self) -> str:
        return self.full[:self.sent]

    def push(self, ids: list[int]) -> bool:
        if self.scored:  # one token at a time: each token's text offset
            for t, sc in zip(ids, self.scored, strict=True):
                self.unsent.append(TokenLogprob(sc, len(self.full)))
                self.full += self.detok.push([t])
            self.scored.clear()
        else:
            self.full += self.detok.push(ids)
        return self._check(final=False)

    def finish(self) -> bool:
        self.full += self.detok.flush()
        return self._check(final=True)

    def _check(self, final: bool) -> bool:
        """Send what is safe; True when a stop string was found (the text ends before it)."""
        hits = [i for i in (self.full.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        if hits:
            self.full = self.full[:min(hits)]
            self._send(len(self.full))
            return True
        self._send(len(self.full) if final else max(self.sent, len(self.full) - self.hold), final)
        return False

    def _send(self, upto: int, final: bool = False) -> None:
        n = len(self.unsent) if final else next(
            (i for i, r in enumerate(self.unsent) if r.offset >= upto), len(self.unsent))
        if upto > self.sent or n:
            if self.sent == 0 and upto > self.sent and self.on_first_text:
                self.on_first_text()
            self.pieces.put_nowait(Piece(self.full[self.sent:upto], self.unsent[:n]))
            self.logprobs += self.unsent[:n]
            self.sent, self.unsent = max(self.sent, upto), self.unsent[n:]
