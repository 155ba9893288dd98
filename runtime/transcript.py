"""The committed tokens of one request, kept once on the edge.

    tokens      [prompt_len + committed]  the prompt, then every verdict's path + bonus
    prompt_len  where the generated tokens begin

Only ``commit`` appends, and only the drafter calls it, when it applies a verdict (after any
branch step has finished: a worker never sees the root move under it). The cloud link reads the
same object to re-prefill or resume a session and to check that a verdict fits; the caller's
output is ``generated`` cut at max_new or a stop token (``rapid.core.acceptance.finish``). The
cloud keeps its own copy on the other side of the wire, and ``Ready.committed`` /
``VerdictFrame.committed`` say how long it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class Transcript:
    tokens: list[int]
    prompt_len: int

    @classmethod
    def of(cls, prompt: Sequence[int]) -> Transcript:
        return cls(list(prompt), len(prompt))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def generated(self) -> list[int]:
        """The tokens committed after the prompt (a copy)."""
        return self.tokens[self.prompt_len:]

    def commit(self, emitted: Sequence[int]) -> None:
        """Append one verdict's tokens (its accepted path, then the bonus)."""
        self.tokens.extend(emitted)
