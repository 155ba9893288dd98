"""The target's log-probabilities of emitted tokens, as the edge receives them in verdicts.

``VerdictFrame.logprobs`` holds one float32 per emitted token (path tokens, then the bonus);
``top_ids`` / ``top_logprobs`` hold k alternatives per token, row-major (``rapid.core.wire``). The
cloud computes them from the raw logits row that picked each token (``rapid.server.scores``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rapid.core.wire import VerdictFrame


@dataclass(slots=True, frozen=True)
class TokenScore:
    token: int
    logprob: float  # log-probability of ``token`` under the target (raw logits, float32)
    top: tuple[tuple[int, float], ...]  # the k most likely tokens there, descending, ties by id


def verdict_scores(frame: VerdictFrame, emitted: list[int]) -> list[TokenScore]:
    """One ``TokenScore`` per emitted token of ``frame`` (empty when none were asked for).

    k = len(top_ids) / len(emitted); token i's alternatives are ``top_*[i·k : (i+1)·k]``."""
    if not frame.logprobs:
        return []
    if len(frame.logprobs) != len(emitted):
        raise ValueError(f"the verdict scores {len(frame.logprobs)} tokens, it emitted {len(emitted)}")
    k = len(frame.top_ids) // len(emitted)
    return [TokenScore(t, lp, tuple(zip(frame.top_ids[i * k:(i + 1) * k], frame.top_logprobs[i * k:(i + 1) * k],
                                        strict=True)))
            for i, (t, lp) in enumerate(zip(emitted, frame.logprobs, strict=True))]
