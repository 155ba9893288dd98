"""Per-round telemetry (stats), its aggregation, and JSON-lines export."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(slots=True)
class RoundRecord:
    round: int
    policy: str
    depth: int  # planned depth L_i
    tree_nodes: int
    tree_depth: int = 0  # the deepest node of the tree sent: the accepted length if the target's path were in it
    lookup_depth: int = 0  # the deepest node of the tree sent on a prompt-lookup chain (0: no chain)
    lookup_p: float = 0.0  # the request's learnt P(lookup token right) when the tree was sent (runtime.lookup)
    tau_cur: float = 0.0  # seconds of the last draft step (CAAC, runtime.step_cost)
    tau_fast: float = 0.0  # EMA of step seconds
    tau_slow: float = 0.0  # EMA of the same steps' uncontended baselines
    esr: float = 1.0
    eta: float = 1.0
    acceptance: float = 0.0
    b_hat: float = 0.0
    draft_steps: int = 0
    proactive_steps: int = 0
    interrupted_at: int | None = None  # proactive step after which feedback stopped the branch
    proactive_hit: bool | None = None  # None: no branch this round
    branch_outcome: str | None = None  # where the verdict landed for the branch (runtime.ipdg.branch_outcome)
    first_wave_p: float | None = None  # the draft's P(verdict lands on a first-wave root) (BranchRoots.mass)
    reused_depth: int = 0  # levels of the next tree that the kept branch supplied
    discarded_steps: int = 0  # proactive steps thrown away on a miss
    catch_up_s: float = 0.0  # a round that drafted nothing: the step feeding the pending tokens in the wait
    beside_s: float = 0.0  # the steps that ran beside the verify (the branch's, or the catch-up): seconds
    beside_tokens: int = 0  # ...and the tokens they fed
    draft_s: float = 0.0
    ahead_s: float = 0.0  # round 0: of draft_s, the part drafted before the cloud's Ready (off the round's path)
    prefill_s: float = 0.0  # round 0: the draft's prompt prefill, before its steps, while the cloud prefilled
    wait_s: float = 0.0  # from sending D_i to having its verdict in hand (edge side)
    cloud_s: float = 0.0  # send → verdict arrival
    verify_s: float = 0.0  # target forward, as reported by the cloud
    accepted: int = 0
    emitted: int = 0
    t_start: float = 0.0
    t_end: float = 0.0


def time_per_output_token(total_s: float, first_s: float | None, tokens: int) -> float | None:
    """The serving benchmarks' TPOT (vLLM's): ``(total_s - first_s) / (tokens - 1)``, every token
    after the first over the time after it; None without a first time, a second token or time
    after the first."""
    if first_s is None or tokens < 2 or total_s <= first_s:
        return None
    return (total_s - first_s) / (tokens - 1)


@dataclass(slots=True)
class Summary:
    policy: str
    tokens: int
    rounds: int
    wall_s: float
    mean_accepted: float
    tokens_per_call: float
    mean_depth: float
    interrupts: int
    hit_rate: float | None
    discarded_ratio: float
    tokens_per_s: float
    ttft_s: float | None = None  # from the start to the first verdict (its tokens are the first); None: no round
    extra: dict = field(default_factory=dict)

    def decode_tok_s(self) -> float | None:
        """Tokens per second after the first verdict: 1 / ``time_per_output_token`` (None where that is)."""
        tpot = time_per_output_token(self.wall_s, self.ttft_s, self.tokens)
        return None if tpot is None else 1.0 / tpot

    def line(self) -> str:
        hit = "-" if self.hit_rate is None else f"{self.hit_rate:.0%}"
        rate = self.decode_tok_s()
        split = "" if rate is None else f"; first tokens after {self.ttft_s:.2f}s, then {rate:.2f} tok/s"
        return (f"[{self.policy}] {self.tokens} tokens in {self.rounds} rounds, {self.wall_s:.2f}s "
                f"({self.tokens_per_s:.2f} tok/s{split}); mean accepted {self.mean_accepted:.2f}, "
                f"tokens/target call {self.tokens_per_call:.2f}, mean depth {self.mean_depth:.2f}, "
                f"interrupts {self.interrupts}, proactive hit rate {hit}, "
                f"discarded expansions {self.discarded_ratio:.0%}")


def summarize(policy: str, records: list[RoundRecord], tokens: int, wall_s: float,
              ttft_s: float | None = None) -> Summary:
    n = max(len(records), 1)
    branches = [r for r in records if r.proactive_hit is not None]
    steps = sum(r.draft_steps + r.proactive_steps for r in records)
    return Summary(
        policy=policy, tokens=tokens, rounds=len(records), wall_s=wall_s,
        mean_accepted=sum(r.accepted for r in records) / n,
        tokens_per_call=tokens / n,
        mean_depth=statistics.fmean([r.depth for r in records]) if records else 0.0,
        interrupts=sum(r.interrupted_at is not None for r in records),
        hit_rate=(sum(bool(r.proactive_hit) for r in branches) / len(branches)) if branches else None,
        discarded_ratio=sum(r.discarded_steps for r in records) / max(steps, 1),
        tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_s=ttft_s,
    )


def write_jsonl(path: str | Path, records: list[RoundRecord], meta: dict | None = None) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            row = asdict(r)
            if meta:
                row.update(meta)
            f.write(json.dumps(row) + "\n")
