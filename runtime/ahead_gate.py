"""Whether round 0 drafts one more level while the cloud still prefills the prompt, pure.

Round 0's tree needs nothing from the cloud, so the coordinator drafts it while the cloud
prefills (Hello → Ready). The controller's depth prices every level at a full draft step on the
round's path; a level drafted before Ready costs nothing, and one that ends a little after it
costs only its overrun. On a slow edge the prefill leaves room: the Zen 2 bench (fp32 target,
64-token prompts) sent Ready ~2.05 s after Hello while the draft's prefill and a 1-level tree took
~1.0 s uncontended (~1.8 s under load), and `rapid` sent that 1-2 level tree and waited.

So an adaptive policy (``Policy.free_levels``) keeps drafting after its planned levels, one
complete step at a time, while Ready has not come and the next step is expected to end at most
``late`` of a step after it:

    start  iff  Ready not seen   and   t + s <= T + late · s

``t`` = seconds since the request began (the Hello), ``s`` = the last draft step's seconds (as
contended as it is now), ``T`` = the expected Hello → Ready time for this prompt,
``T = r · P`` with ``r`` the EMA of (Hello → Ready seconds) / (prompt tokens) over this session's
requests (the cloud's prefill is about linear in the prompt: 26-token prompts gave 0.032 s/token
on the Zen 2, 64-token ones 0.032). Until one Ready has been seen no extra level is drafted (the
old behaviour). The late allowance: a level ending ``o`` after Ready delays round 0 by ``o``,
where a later round pays the whole step ``s`` for a level; ``late = 0.5`` takes a level for at
most half its price. The levels stop at ``cap`` (the controller's deepest and the tokens left), and
the send cut (``TreeCut.pays_to_grow``, drafting priced at 0) stops them where none would be sent.

Only how deep round 0 is drafted changes; the cloud's acceptance does not, so the tokens are the
target's whatever the gate decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AheadGate:
    alpha: float = 0.3  # EMA rate of the cloud's prefill time per prompt token
    late: float = 0.5  # a step may end this fraction of itself after the expected Ready
    per_token_s: float = 0.0  # EMA of (Hello → Ready seconds) / prompt tokens (0: unknown)

    def __post_init__(self) -> None:
        if not (0.0 < self.alpha <= 1.0 and 0.0 <= self.late <= 1.0):
            raise ValueError(f"need alpha in (0, 1] and late in [0, 1], got {self.alpha}, {self.late}")

    def observe(self, seconds: float, prompt_tokens: int) -> None:
        """One request's Hello → Ready time for a prompt of ``prompt_tokens``."""
        if seconds > 0.0 and prompt_tokens > 0:
            x = seconds / prompt_tokens
            old = self.per_token_s
            self.per_token_s = x if old <= 0.0 else old + self.alpha * (x - old)

    def expected(self, prompt_tokens: int) -> float:
        """Expected Hello → Ready seconds for a prompt of ``prompt_tokens`` (0: unknown)."""
        return self.per_token_s * max(prompt_tokens, 0)

    def start(self, elapsed_s: float, step_s: float, prompt_tokens: int) -> bool:
        """Start one more round-0 step ``elapsed_s`` after the Hello, a step taking ``step_s``?
        (module docstring; False while the Ready time is unknown)"""
        big_t = self.expected(prompt_tokens)
        if big_t <= 0.0 or step_s <= 0.0:
            return False
        return elapsed_s + step_s <= big_t + self.late * step_s
