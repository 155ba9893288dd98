"""Log-probabilities in the OpenAI response shapes (``/v1/completions`` and ``/v1/chat/completions``).

The numbers are the cloud's (``rapid.runtime.token_scores``: the target's log-probability of each
emitted token from the raw logits row that picked it, before temperature / top-p / top-k, as
vLLM's default; float32). This module only names tokens and lays the numbers out:

    chat         choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
    completions  choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}

A token's ``bytes`` are its exact bytes (byte-level BPE pieces through GPT-2's byte map,
SentencePiece ``<0xHH>`` byte tokens), else the UTF-8 of its decoded text; ``token`` is those
bytes decoded (U+FFFD for a partial character). ``text_offset`` is where the token's text starts
in the completion. A legacy ``top_logprobs`` dict also holds the chosen token (OpenAI: "up to
logprobs + 1 elements"). ``-inf`` (JSON has no infinity) is sent as ``LOGPROB_FLOOR``, as vLLM does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rapid.runtime.token_scores import TokenScore
from rapid.tiny import bytes_to_unicode

LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf in JSON
_BYTE_OF = {ch: b for b, ch in bytes_to_unicode().items()}
_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One emitted token as the API reports it."""

    score: TokenScore
    offset: int  # start of the token's text in the completion text


class TokenNames:
    """Token id → (text, bytes) for one tokenizer, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token)
        if hit is None:
            raw = token_bytes(self.tok, token)
            hit = self._cache[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The exact bytes of ``token`` where the vocabulary spells them, else its text's UTF-8."""
    piece = tokenizer.convert_ids_to_tokens(int(token))
    if isinstance(piece, str) and piece:
        if all(ch in _BYTE_OF for ch in piece):
            return bytes(_BYTE_OF[ch] for ch in piece)
        m = _HEX_BYTE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
    return tokenizer.decode([int(token)]).encode("utf-8")


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def chat_logprobs(records: list[TokenLogprob], names: TokenNames) -> dict:
    """``choices[].logprobs`` of a chat completion (or of one stream chunk)."""
    content = []
    for r in records:
        text, raw = names(r.score.token)
        top = [{"token": names(t)[0], "logprob": _lp(lp), "bytes": names(t)[1]} for t, lp in r.score.top]
        content.append({"token": text, "logprob": _lp(r.score.logprob), "bytes": raw, "top_logprobs": top})
    return {"content": content}


def completion_logprobs(records: list[TokenLogprob], names: TokenNames) -> dict:
    """``choices[].logprobs`` of a legacy completion (or of one stream chunk)."""
    tops = []
    for r in records:
        top = {names(t)[0]: _lp(lp) for t, lp in r.score.top}
        top.setdefault(names(r.score.token)[0], _lp(r.score.logprob))
        tops.append(top)
    return {"tokens": [names(r.score.token)[0] for r in records],
            "token_logprobs": [_lp(r.score.logprob) for r in records],
            "top_logprobs": tops, "text_offset": [r.offset for r in records]}
