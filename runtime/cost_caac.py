"""The cost-aware depth policy (``rapid-cost``): CAAC's gate and IPDG, with the depth chosen by
expected accepted tokens per second of wall time instead of an acceptance set point.

A round of depth ``D`` whose first ``r`` levels came from a kept proactive branch costs, on the
critical path, the draft steps of levels ``r..D-1``, the link's round trip and the verify of
its tree; it yields the accepted tokens plus the bonus. A proactive policy also drafts the next
tree's first levels during the wait, which saves that much of the next round when the branch is
kept, and it is kept far more often after a fully accepted round::

    depth* = argmax_{D in [max(min_depth, r), max_depth]}  (1 + sum_{d=1..D} P(reach d))
                                                  / (draft(D, r) + RTT + V(n(D)) - saved(D))
    draft(D, r) = sigma * sum_{l=r..D-1} tau_hat(T_l),   T_0 = 1 (the root step), T_l = width (frontier)
    sigma       = ESR while CAAC's gate is shut (eta < 1), else 1     (the contended step cost)
    saved(D)    = (P(reach D) k_full' + (1 - P(reach D)) k_part) (1 - P_lookup(D + 1))
                  * min(RTT + V(n(D)), draft(D, 0))          (proactive policies; 0 otherwise)
    k_full'     = k_full where the branch gate lets a second wave run (2 s <= T), else 0
    L = clamp(depth*, min_depth, max_depth)

``P(reach d)``, ``V`` (the cloud's verify curve from ``Ready``, refreshed by each verdict's
``verify_s``), ``n(D)``, ``RTT`` (verdict arrival - send - verify_s) and the kept-branch rates
``k_full`` / ``k_part`` are the estimates of :mod:`rapid.runtime.cost_model`; ``tau_hat(T)`` is
the uncontended per-size step baseline of :mod:`rapid.runtime.step_cost` (piecewise linear
between the sizes seen). ``saved`` charges the next round's saving to the round whose outcome
earns it (a branch is drafted for the length of the wait, at most one tree). A verdict that a
lookup chain carries past the drafted levels (``P_lookup(D + 1)``, below) lands on a node the
draft never fed, where no root can be: that round keeps no branch, so it saves nothing and is no
sample of ``k_full`` / ``k_part`` either. Counted as a full round that lost its branch, oasst's
copy rounds drove ``k_full`` down for the next request; priced as a likely saving, they kept
rapid-cost drafting depth 1 beside a 9-token chain (a round of 0.36 s where the chain alone
took 0.23 s on the Zen 4's slow edge).

A fully accepted round ends on a leaf of D_i, which no draft step has fed: a root there needs the
branch's second step (``rapid.runtime.branch_gate``: the first feeds the leaves, the second the
roots below them), and the gate runs none where two branch steps outlast the wait (2 s > T, with
``s`` the branch's own contended step). Then no branch can be kept after a fully accepted round:
``k_full`` is priced at 0, and such a round is no sample of it (it says nothing of how often a
second wave is kept). Learnt across loads instead, ``k_full`` carried the no-load rate (~0.8)
into a sustained load where a step is 0.7 of the wait, and priced depth 2 for a saving that could
not happen: on the Zen 2's slow edge rapid-cost's depth-2 rounds under load gave 2.92-2.98
tokens/s against 3.12-3.13 at depth 1 (``bench-out/zen2-slow-stop``, ``zen2-slow-free``). With
the fix the throughput moved within the noise (``zen2-slow-kfull``): the depth-2 rounds under
load moved to humaneval, where two levels are accepted in most rounds and the reach alone pays.

Under load the gate does not multiply the depth (CAAC's ``eta * B_hat``): a slowdown raises the
price of a draft step by ESR, the slowdown the gate measures, and the depth is the argmax at that
price. ESR compares each step with its own kind (``rapid.runtime.step_cost``): a branch or
catch-up step beside the verify with the steps beside it, so the co-location of one host is not
read as load (against the drafting steps, rapid-cost's catch-up steps under load put its ESR at
3.1 for a 2.2x load and held depth 0 for whole generations). A shrink by ``eta`` alone threw the round's acceptance away: with a slow edge (a step
~0.4 of a verify) under a 2x load CAAC went to depth 1 and accepted under one token a round,
where the rate at depth 2-3 is higher because the verify and the RTT are paid per round, not per
step. Inside the band (eta = 1) sigma is 1, so the baselines, learnt without load, price a step
and a passing jitter does not move the depth. Ties go to the shallower depth. Until a step, a
verify time and an RTT are known (the first round), the depth is CAAC's.

**Depth 0: a round that drafts nothing.** The argmax also runs over D = 0: the tree is the
prompt-lookup chains alone (``Drafter.lookup_round``; an empty tree, one target step, where
nothing matches), costing ``V(n_0) + RTT`` for ``1 + E_lookup`` tokens, where ``E_lookup`` =
sum over the chains' nodes of exp(score), each lookup token scoring log ``LookupStats.p``
(``Drafter.lookup_outlook``, observed after every verdict). The chains join every drafted tree
too, so a depth D >= 1 yields ``1 + sum_{d<=D} (1 - (1 - P(reach d)) (1 - P_lookup(d))) +
sum_{d>D} P_lookup(d)`` (``choose_depth``; E_lookup = sum_d P_lookup(d)): a draft adds little
where the chains are strong. Depth 0 wins where a draft step costs more than it buys: a slow
edge under load (the PyTorch draft at ~0.3 s a step against a ~0.25 s target step: drafting
made every round slower per token than the target alone).

A round without a step measures neither the step nor the acceptance, so a depth-0 choice is
sticky and must not rest on a near tie of noisy estimates (without load, on c4, a reach estimate
that a few misses had put at 0.18 tied the empty tree at 4.5 tokens/s and held the edge there for
rounds: rapid-cost 5.1 tokens/s against rapid's 6.4, ``bench-out/amx-vsar-d0``). So depth 0 must
beat the best drafted depth by ``CostConfig.skip_margin`` (5 %) while the edge is measurably
slowed down (CAAC's gate shut, eta < 1, and the last ``CostConfig.slow_steps`` (2) measured steps
each slower than ``band_hi`` times their size's baseline), else by ``CostConfig.open_skip_margin``
(25 %): without load only chains that carry the round on their own send it undrafted (oasst's
copy rounds on the Zen 4's slow edge: 3.8 tokens a round at 0.18 s, against 6 at ~0.74 s for
``fixed``'s drafted depth 4). The run of slow steps: one step shuts the gate (ESR moves half way
to a step's ratio), and on a shared CPU about one step in ten is a spike 1.3-1.8x its baseline
(the PyTorch draft on the Zen 4 without load: 8 of 94 of ``fixed``'s draft steps, 9 of 50 of
``rapid``'s proactive ones, which overlap the target's verify on the other core). Priced at that
ESR, one spike put rapid-cost at depth 0 for whole generations without load: a round that drafts
nothing measures no step, and a probe's one step, feeding the tokens the skipped rounds left
pending, is of a size not seen before and reads as neutral (``rapid.runtime.step_cost``). A step
at its baseline ends the run. After ``CostConfig.max_undrafted`` undrafted rounds in a row one
round drafts (a probe); a probe followed by another undrafted round doubles the interval, up to
``PROBE_BACKOFF`` times, and a drafted round after it resets it: a load that lifts is seen within
~32 rounds, and a draft that stays too slow costs one drafted round in 33. CAAC's own depth
(``rapid``) stays in 1..max_depth.

**What the reach counts.** ``P(reach d)`` is the draft's: the chains are priced apart (above). A
round whose verdict went past the levels it drafted was carried there by a lookup chain, and
which of its drafted levels the draft's own nodes matched the verdict does not say, so it is no
reach sample (as it is no sample of CAAC's PID); counted as reaching every drafted level, the
copy rounds of a text that repeats its prompt raised the draft's reach, and the estimates are
carried into the next request, whatever its text. A request's first verdict counts from level 2:
its level 1 is the reply's first token, which the draft gets right far less often than any later
position (top-1 0.52 against 0.81, CAAC's docstring), while its levels below a right first are
drafted as well as any (0.81 after a right first). Counted, that one biased sample pulled the
level-1 rate of every request down, and under load priced depth 0 above depth 1 for the request's
first rounds (the slow edge under burst, mtbench: rounds 1-7 undrafted, one token each, in 2 of 3
repeats, where ``rapid``'s depth-1 rounds accepted every level, ``bench-out/zen2-catchup``).

The proactive branch (IPDG) is unchanged; its target is this rule applied after the verdict it
guesses (``next_depth_if``). CAAC's proactive time cap is not applied: the cost model already
charges every draft step on the critical path.

Only the depth is chosen here; the tree budget stays the session's (``--budget``, ``auto`` =
the cloud's flat size). Choosing it too needs acceptance as a function of the budget, which
one session observes at a single budget.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from rapid.runtime.caac import CAAC, CAACConfig
from rapid.runtime.cost_model import (
    BranchYield,
    CloudCosts,
    CostConfig,
    ReachEstimate,
    interpolate,
)
from rapid.runtime.depth_control import CAACDecision, carried_by_chain

__all__ = ["CostAwareCAAC", "choose_depth", "draft_seconds"]

PROBE_BACKOFF = 8  # the probe interval grows to at most this many times CostConfig.max_undrafted


def choose_depth(reach: Sequence[float], draft_s: Sequence[float], verify_s: Sequence[float], rtt_s: float,
                 lo: int, lookup: Sequence[float] = (), margin: float = 0.0) -> tuple[int, list[float]]:
    """``argmax_{D in [lo, len(reach)]} gain(D) / (draft_s[D] + verify_s[D] + rtt_s)`` (ties: the
    shallower D; D = 0 only where its rate is ``1 + margin`` times the best drafted one) and the
    rate of every D (index D; 0.0 below ``lo``), where

        gain(D) = 1 + sum_{k<=D} (1 - (1 - reach[k-1]) (1 - lookup[k-1])) + sum_{k>D} lookup[k-1]

    ``reach[k-1]`` = P(the draft's nodes carry the accepted path to level k); ``lookup[k-1]`` =
    P(the prompt-lookup chains do), chains that join every tree (missing levels: 0). Where both
    reach a level, they count as independent: a draft adds the most where the chains are weak.
    D = 0 (``lo = 0``) is a round that drafts nothing: the chains alone, or an empty tree (one
    target step). ``draft_s`` / ``verify_s`` are indexed by D (length ``len(reach) + 1``). A
    non-positive round time never wins."""
    hi = len(reach)
    if not 0 <= lo <= hi or len(draft_s) != hi + 1 or len(verify_s) != hi + 1:
        raise ValueError(f"need 0 <= lo <= {hi} and cost arrays of length {hi + 1}")
    chain = list(lookup) + [0.0] * max(0, hi - len(lookup))
    rates = [0.0] * (hi + 1)
    best, best_rate = max(1, lo), -1.0
    for d in range(lo, hi + 1):
        both = sum(1.0 - (1.0 - reach[k]) * (1.0 - chain[k]) for k in range(d))
        gain = 1.0 + both + sum(chain[d:])
        t = draft_s[d] + verify_s[d] + rtt_s
        rates[d] = gain / t if t > 0 else 0.0
        if d >= 1 and rates[d] > best_rate:
            best, best_rate = d, rates[d]
    if lo == 0 and rates[0] > 0.0 and rates[0] >= (1.0 + margin) * best_rate:
        best = 0
    return best, rates


def draft_seconds(step_s: dict[int, float], width: int, max_depth: int, reused: int) -> list[float] | None:
    """``draft(D, reused)`` for D = 0..max_depth from the per-size step baselines ``{T: seconds}``
    (interpolated; None when empty): ``sum_{l=reused..D-1} tau(T_l)``, T_0 = 1, T_l = width."""
    root, frontier = interpolate(1, step_s), interpolate(width, step_s)
    if root is None or frontier is None:
        return None
    root, frontier = max(root, 0.0), max(frontier, 0.0)
    out = [0.0] * (max_depth + 1)
    for d in range(1, max_depth + 1):
        out[d] = out[d - 1] + (0.0 if d - 1 < reused else (root if d == 1 else frontier))
    return out


class CostAwareCAAC(CAAC):
    """CAAC's physical path and gate with the depth of :func:`choose_depth` (module docstring)."""

    def __init__(self, config: CAACConfig | None = None, initial_depth: int = 4,
                 cost: CostConfig | None = None) -> None:
        super().__init__(config, initial_depth)
        self.cost = cost or CostConfig()
        self._reach = ReachEstimate(self.config.max_depth, self.cost)
        self.costs = CloudCosts.fresh(self.cost.alpha_verify, self.cost.alpha_rtt)  # the send cut reads them too
        self._branch = BranchYield(self.cost.alpha_reach)
        self._lookup: tuple[list[float], int] = ([], 0)  # the lookup-only tree a round would send
        # now: (P(its chains reach level k) for k = 1.., nodes)
        self._undrafted = 0  # rounds in a row sent without a draft step
        self._probe_every = self.cost.max_undrafted  # undrafted rounds allowed before one drafts
        self._after_probe = False  # the last round drafted because _probe_every ran out

    def new_request(self) -> None:
        super().new_request()
        self._lookup, self._undrafted = ([], 0), 0
        self._reach.carry(self.cost.request_rounds)  # the last request's reach: a prior (module docstring)

    def observe_lookup(self, reach: Sequence[float], nodes: int) -> None:
        """The prompt-lookup chains the next tree would carry: P(they reach level k), k = 1..
        (``Drafter.lookup_outlook``), and their node count."""
        self._lookup = ([min(1.0, max(0.0, float(x))) for x in reach], max(0, int(nodes)))

    # ---- what the cloud and the link report -----------------------------------------------
    def observe_cloud(self, curve_nodes: Sequence[int], curve_s: Sequence[float], budget: int,
                      width: int) -> None:
        """A session opened: the cloud's start-up verify curve and this session's tree shape."""
        self.costs.verify.start(list(curve_nodes), list(curve_s))
        self.costs.link.budget, self.costs.link.width = max(0, int(budget)), max(1, int(width))

    def observe_verdict(self, depth: int, nodes: int, verify_s: float, rtt_s: float | None,
                        accepted: int | None = None, hit: bool | None = None) -> None:
        """A verdict for a tree of ``depth`` levels and ``nodes`` nodes: its ``verify_s``, the
        link's share of the wait (arrival - send - verify_s) and, when a proactive branch ran,
        whether it was kept (``hit``) after ``accepted`` of ``depth`` levels."""
        self.costs.verify.observe(int(nodes), float(verify_s))
        self.costs.link.observe(int(depth), int(nodes), rtt_s)
        self._count_undrafted(depth)
        full = accepted is not None and accepted >= depth
        if hit is not None and accepted is not None and not carried_by_chain(accepted, depth) \
                and (not full or self.gate.second_wave(0.0)):  # (docstring)
            self._branch.observe(full, bool(hit))

    def _count_undrafted(self, depth: int) -> None:
        """Rounds without a draft step in a row, and the probe interval: a probe (a drafted round
        forced by the interval) followed by another undrafted round doubles it, up to
        ``PROBE_BACKOFF`` times ``max_undrafted``; followed by a drafted one, it resets."""
        base = self.cost.max_undrafted
        if self._after_probe:
            self._probe_every = min(PROBE_BACKOFF * base, 2 * self._probe_every) if depth < 1 else base
        self._after_probe = depth >= 1 and base > 0 and self._undrafted >= self._probe_every
        self._undrafted = self._undrafted + 1 if depth < 1 else 0

    def observe_round(self, accepted: int, depth: int, cloud_seconds: float | None = None,
                      b_hat: float | None = None) -> None:
        before, first = self._ignored_rounds, self._verdicts == 0
        super().observe_round(accepted, depth, cloud_seconds, b_hat)
        if self._ignored_rounds == before and not carried_by_chain(accepted, depth):  # validated (docstring)
            self._reach.observe(int(accepted), int(depth), 2 if first else 1)  # level 1 of a request's
            # first verdict is the reply's first token (docstring)

    # ---- the decision --------------------------------------------------------------------
    def cost_depth(self, reused: int = 0, proactive: bool = False, sigma: float = 1.0,
                   undrafted: bool = False, margin: float | None = None) -> tuple[int, list[float]] | None:
        """(depth*, rate by depth) from the current estimates, a draft step priced at ``sigma``
        times its baseline, depth 0 (no draft step) a candidate with ``undrafted`` where it beats
        drafting by ``margin`` (default ``skip_margin``); None while a cost is unknown."""
        c, link = self.config, self.costs.link
        table = {t: sigma * s for t, s in self._phys.baseline.classes().items()}
        steps = draft_seconds(table, link.width, c.max_depth, max(0, reused))
        if steps is None or link.rtt is None or self.costs.verify.predict(1) is None:
            return None
        chains, nodes = self._lookup
        verify = [self.costs.verify.predict(nodes) or 0.0] + [
            self.costs.verify.predict(link.tree_nodes(d)) or 0.0 for d in range(1, c.max_depth + 1)]
        reach = self._reach.reach()
        if proactive:  # the critical path less the expected saving of a kept branch (docstring)
            whole = draft_seconds(table, link.width, c.max_depth, 0) or steps
            kf = self._branch.rate(True) if self.gate.second_wave(0.0) else 0.0  # (docstring)
            kp = self._branch.rate(False)
            past = [chains[d] if d < len(chains) else 0.0 for d in range(c.max_depth + 1)]  # P(a chain passes D)
            steps = [steps[0]] + [steps[d] - (reach[d - 1] * kf + (1 - reach[d - 1]) * kp) * (1.0 - past[d])
                                  * min(link.rtt + verify[d], whole[d]) for d in range(1, c.max_depth + 1)]
        lo = 0 if undrafted and reused <= 0 else min(c.max_depth, max(c.min_depth, reused))
        margin = self.cost.skip_margin if margin is None else margin
        return choose_depth(reach, steps, verify, link.rtt, lo, chains, margin)

    def next_depth(self, proactive: bool = False, reused: int = 0) -> CAACDecision:
        """``clamp(depth*)`` at the contended step price (sigma = ESR while eta < 1), or 0 (draft
        nothing this round) while the gate is shut, where that rate beats every drafted depth's
        by ``skip_margin`` and fewer than the probe interval's rounds in a row drafted nothing;
        CAAC's depth while the costs are unknown."""
        esr, eta = self._gate()
        slowed = eta < 1.0 and self._phys.slow_run >= self.cost.slow_steps  # not one spike (docstring)
        margin = self.cost.skip_margin if slowed else self.cost.open_skip_margin
        best = self.cost_depth(reused, proactive, esr if eta < 1.0 else 1.0,
                               self._undrafted < self._probe_every, margin)
        if best is None:
            return super().next_depth(proactive)
        c = self.config
        depth = 0 if best[0] == 0 else min(c.max_depth, max(c.min_depth, best[0]))
        return self._decision(depth, esr, eta, float(best[0]), False)

    def next_depth_if(self, accepted: int, depth: int, b_hat: float | None = None,
                      proactive: bool = True) -> CAACDecision:
        what_if = copy.copy(self)  # as CAAC's; the shared physical path and costs are only read
        what_if._reach = self._reach.copy()  # observe_round changes it in place
        what_if.observe_round(accepted, depth, None, b_hat)
        return what_if.next_depth(proactive)

    def snapshot(self) -> dict:
        snap = super().snapshot()
        best = self.cost_depth(0, True)
        snap.update({"policy": type(self).__name__, "cost_depth": 0 if best is None else best[0],
                     "rtt_s": self.costs.link.rtt or 0.0, "pooled_acceptance": self._reach.pooled(),
                     "verify_points": len(self.costs.verify.measured),
                     "kept_after_full": self._branch.rate(True), "kept_after_partial": self._branch.rate(False)})
        return snap
