"""What one generation has handed out so far: the committed tokens cut at ``max_new`` or a stop
token, their scores, the round records, and the callers' callbacks for each round's share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rapid.core.acceptance import finish
from rapid.runtime.telemetry import RoundRecord
from rapid.runtime.token_scores import TokenScore, verdict_scores
from rapid.runtime.transcript import Transcript


@dataclass(slots=True)
class Emitted:
    """What one generation handed out so far: the transcript's generated tokens cut at max_new /
    a stop token, and the callers' callbacks for each round's share."""

    transcript: Transcript  # the drafter's: already holds the round's emitted tokens at ``take``
    max_new: int
    stop_ids: Sequence[int]
    on_tokens: Callable[[list[int]], None] | None
    on_scores: Callable[[list[TokenScore]], None] | None
    tokens: list[int] = field(default_factory=list)  # the transcript's generated tokens, cut
    scores: list[TokenScore] = field(default_factory=list)
    records: list[RoundRecord] = field(default_factory=list)
    stopped: bool = False

    def take(self, verdict, emitted: list[int], rec: RoundRecord) -> bool:
        """Hand out a committed round's share (``emitted`` scores them); True when done."""
        before = len(self.tokens)
        self.tokens, done = finish(self.transcript.generated, self.max_new, self.stop_ids)
        self.scores = (self.scores + verdict_scores(verdict, emitted))[:len(self.tokens)]
        self.stopped = done and bool(self.tokens) and self.tokens[-1] in self.stop_ids
        rec.emitted = len(self.tokens) - before
        if self.on_scores and rec.emitted and self.scores:
            self.on_scores(self.scores[before:])
        if self.on_tokens and rec.emitted:
            self.on_tokens(self.tokens[before:])
        return done
