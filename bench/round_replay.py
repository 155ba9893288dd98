"""Where a simulated generation follows a traced one of its own policy, the rounds it replays
(``rapid sim``'s acceptance replay, ``rapid.bench.calibration.fit_acceptance``).

The match string is position-aligned: index ``start + p`` is position ``p`` of the generation
that begins at replay index ``start``. A bit says whether the target's token there was in the
tree *at the level that round had there*, and a tree's levels differ: the first is the widest
(its root's next tokens are known), deeper ones thin out under the budget. So bits read from
another policy's rounds (rooted elsewhere, at other depths) are another policy's acceptance: on
a Zen 3 slow edge, `fixed` replaying every policy's generations of humaneval took 6 rounds in
6 of 20 seeds where all three traced repeats took 7 (+16 % throughput). A simulated generation
therefore starts at one of its own policy's traced generations, under its own schedule where
there is one (the send cut below depends on the step's cost, so a loaded `fixed` accepts other
stretches than an idle one), else of its policy, else at any.

And what a round sends is the draft's choice at that position, not a constant: at planned
depth 4 `fixed` sent 1, 2 or 4 levels (the send cut keeps the levels whose nodes pay) and ran
2-4 steps (the root's next token is often known). Where a simulated round starts where a traced
round of its policy started, with the same planned depth and the same levels kept from a
branch, it replays that round's draft steps, sent levels and nodes; elsewhere it takes the
policy's medians by depth. Timing (steps, verify, link, taxes) is always the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class TracedRound:
    policy: str
    depth: int  # planned depth (after the cap at the tokens left)
    reused: int  # levels the previous round's kept branch supplied
    steps: int  # draft steps it ran
    levels: int  # levels of the tree it sent (a prompt-lookup chain included)
    nodes: int  # nodes it sent


@dataclass(slots=True)
class RoundReplay:
    starts: list[int] = field(default_factory=list)  # replay index where each traced generation begins
    runs: list[tuple[str, str]] = field(default_factory=list)  # ... and its (policy, schedule)
    rounds: dict[int, TracedRound] = field(default_factory=dict)  # by the replay index of its start

    def add_start(self, index: int, policy: str, schedule: str) -> None:
        self.starts.append(index)
        self.runs.append((policy, schedule))

    def starts_for(self, policy: str | None, schedule: str | None = None) -> list[int]:
        """The traced generations of ``policy`` under ``schedule`` where there are any, else of
        ``policy``, else every one."""
        same = [s for s, run in zip(self.starts, self.runs, strict=True) if run == (policy, schedule)]
        own = [s for s, run in zip(self.starts, self.runs, strict=True) if run[0] == policy]
        return same or own or self.starts

    def at(self, index: int, policy: str, depth: int, reused: int) -> TracedRound | None:
        """The traced round that started at ``index`` if it was ``policy``'s and planned ``depth``
        with ``reused`` levels kept (a simulated round that follows it), else None."""
        r = self.rounds.get(index)
        if r is None or (r.policy, r.depth, r.reused) != (policy, depth, reused):
            return None
        return r
