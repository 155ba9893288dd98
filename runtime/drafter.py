"""The edge's drafting state over one ``DraftEngine``: committed prefix, active tree, branch.

Invariants (checked by tests):
- draft KV slots ``[0, prefix_len)`` hold the committed tokens except ``pending``;
- every fed tree node has a slot ≥ prefix_len; ``engine.kv_len`` is the next free slot;
- the root of the active tree is the last committed token, at position ``len(committed) - 1``.

One expansion step is one engine call. Step 0 of a tree feeds the pending tokens (causal) and
yields the root's children, and the prompt-lookup chains join (``runtime.lookup``); every later
step feeds the best ``width`` expandable nodes at any depth (best-first, ``runtime.tree``). The
proactive branch (IPDG) uses the same steps under the chosen roots (``runtime.ipdg`` chooses
them, ``runtime.branch_roots`` records where they hang).

Children are ranked and scored by the draft's log-softmax under greedy decoding (or with
``TreeParams.coupled`` off); when the request samples they are coupled to the target's seeded
noise (``runtime.coupling``): the child of a fed node sits at absolute position
``root_position + depth + 1``, the key of the target's draw there.

A step is complete when the engine's ``StepHandle.ready()`` says so (a CUDA event query on GPU
backends, True at once on CPU ones); only then are its logits read and the step returned, so the
caller's feedback-flag check after each step always follows a completed step. While a step is in
flight the drafter polls every ``poll_s`` seconds, sleeping in between: the GIL and the core are
free for the event loop that receives the verdict (an event wait may spin). ``poll_s = 1e-4``
adds at most ~0.1-0.2 ms to a step (Linux sleep granularity), a few per cent of a 5-30 ms GPU or
Jetson draft step; a step not complete after ``ready_timeout_s`` raises ``StepTimeoutError``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from rapid.core.errors import RapidError
from rapid.core.geometry import ROOT, ancestor_mask, causal_allowed, node_positions
from rapid.core.sampling import SamplingParams, log_softmax
from rapid.engines.base import DraftEngine, StepHandle
from rapid.runtime.branch_roots import BranchRoots
from rapid.runtime.coupling import coupled_top
from rapid.runtime.ipdg import VerdictPlan, choose_proactive_roots, plan_verdict
from rapid.runtime.lookup import LookupStats, lookup_continuations
from rapid.runtime.transcript import Transcript
from rapid.runtime.tree import TokenTree, TreeParams, best_tokens


class StepTimeoutError(RapidError):
    """The engine never reported a launched step complete."""


class DraftStateError(RapidError):
    """A drafter call that its current tree does not allow (a caller's bug, not bad input)."""


@dataclass(slots=True)
class StepRecord:
    tokens: int  # T fed in this step
    seconds: float
    phase: str  # "draft" | "leaf" | "branch" | "prefill" | "catch_up"


@dataclass(slots=True)
class Boundary:
    """Saved state before proactive expansion: the tree and the KV extent."""

    tree: TokenTree
    kv_len: int


class Drafter:
    def __init__(self, engine: DraftEngine, params: TreeParams, stop_ids: Sequence[int] = (),
                 clock: Callable[[], float] = time.perf_counter, poll_s: float = 1e-4,
                 ready_timeout_s: float = 60.0) -> None:
        if not (poll_s > 0 and ready_timeout_s > 0):
            raise ValueError(f"poll_s and ready_timeout_s must be > 0, got {poll_s}, {ready_timeout_s}")
        self.engine = engine
        self.params = params
        self.stop_ids = tuple(stop_ids)
        self.clock = clock
        self.poll_s, self.ready_timeout_s = poll_s, ready_timeout_s
        self.transcript = Transcript.of([])  # the request's committed tokens (rapid.runtime.transcript)
        self.pending: list[int] = []
        self.prefix_len = 0
        self.tree = TokenTree()
        self.levels = 0  # expansion steps already applied to the active tree
        self.roots = BranchRoots()  # the proactive branch's roots (runtime.branch_roots)
        self._branch_width = params.width
        self.sampling = SamplingParams()
        self.lookup = LookupStats(params.lookup_p)
        self._proposed: list[list[int]] = []  # lookup continuations in the active tree

    # ---- set-up ---------------------------------------------------------------------------
    def start(self, prompt: Sequence[int], sampling: SamplingParams | None = None) -> None:
        """A new request; ``sampling`` (the request's, greedy if None) decides coupled ranking."""
        self.engine.reset()
        self.sampling = sampling or SamplingParams()
        self.transcript = Transcript.of(prompt)
        self.pending = list(prompt)
        self.prefix_len = 0
        self.tree = TokenTree()
        self.levels = 0
        self.roots.clear()  # a request that ended mid-round may have left a branch
        self._branch_width = self.params.width
        self.lookup = LookupStats(self.params.lookup_p)
        self._proposed = []

    @property
    def committed(self) -> list[int]:
        """Prompt + committed tokens (the transcript's list: read, never append)."""
        return self.transcript.tokens

    @property
    def root_position(self) -> int:
        return len(self.transcript) - 1

    @property
    def coupled(self) -> bool:
        """Children ranked by the target's noise: the request samples and ``params.coupled``."""
        return self.params.coupled and not self.sampling.greedy

    # ---- expansion ------------------------------------------------------------------------
    def _feed(self, tokens: list[int], pos: list[int], allowed, phase: str, rows: list[int]) -> tuple:
        """One engine step; the ranked next-token candidates of the given ``rows``."""
        t0 = self.clock()
        handle = self.engine.step(tokens, pos, allowed)
        self._until_ready(handle)
        logits = handle.logits()  # complete: no wait
        best = self._ranked(logits[rows], [pos[r] + 1 for r in rows])
        return best, StepRecord(len(tokens), self.clock() - t0, phase)

    def _ranked(self, logits, child_pos: list[int]) -> list[list[tuple[int, float]]]:
        """Per row, the ``topk + 1`` best (token, score) candidates for its child at ``child_pos``:
        by the draft's log-softmax, or coupled (``rapid.runtime.coupling``) under sampling."""
        k = self.params.topk + 1
        if self.coupled:
            return [coupled_top(row, p, self.sampling, k) for row, p in zip(logits, child_pos, strict=True)]
        return [best_tokens(row, k) for row in log_softmax(logits)]

    def _until_ready(self, handle: StepHandle) -> None:
        """Return once ``handle.ready()``: poll, sleeping ``poll_s`` between queries."""
        if handle.ready():
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while not handle.ready():
            if time.monotonic() > deadline:
                raise StepTimeoutError(f"draft step not complete after {self.ready_timeout_s:g} s")
            time.sleep(self.poll_s)

    def _feed_nodes(self, nodes: list[int], phase: str) -> StepRecord:
        kv = self.engine.kv_len
        allowed = ancestor_mask(self.tree.parents, nodes, self.tree.slot, kv, see=self.prefix_len)
        pos = node_positions([self.tree.depth[i] for i in nodes], self.root_position)
        best, rec = self._feed([self.tree.tokens[i] for i in nodes], pos, allowed, phase, list(range(len(nodes))))
        for r, i in enumerate(nodes):
            self.tree.slot[i] = kv + r
            self.tree.set_best(i, best[r])
        return rec

    def prefill(self) -> StepRecord | None:
        """Feed the pending tokens but the last (the root's step feeds that one), before the first
        tree: the coordinator runs it while the cloud prefills the same prompt. None: nothing to do."""
        if self.levels or len(self.pending) < 2:
            return None
        n = len(self.pending) - 1
        kv = self.engine.kv_len
        t0 = self.clock()
        self._until_ready(self.engine.step(self.pending[:n], list(range(self.prefix_len, self.prefix_len + n)),
                                           causal_allowed(kv, n)))
        self.prefix_len += n
        self.pending = self.pending[n:]
        return StepRecord(n, self.clock() - t0, "prefill")

    def catch_up(self) -> StepRecord | None:
        """A round that drafted nothing (depth 0), while the cloud verifies its chains: feed the
        pending tokens but the last, as ``prefill`` does (None: nothing to feed). The sent tree has
        no fed node, so the verdict is reconciled as it would be without this step, and the next
        round that drafts feeds one or two tokens instead of every token the skipped rounds left."""
        rec = self.prefill()
        return None if rec is None else StepRecord(rec.tokens, rec.seconds, "catch_up")

    def step(self, phase: str = "draft") -> StepRecord | None:
        """One expansion step of the active tree: step 0 feeds the root, later ones the best
        expandable nodes (``TokenTree.frontier``)."""
        p = self.params
        if self.levels == 0:
            n = len(self.pending)
            kv = self.engine.kv_len
            best, rec = self._feed(self.pending, list(range(self.prefix_len, self.prefix_len + n)),
                                   causal_allowed(kv, n), phase, [n - 1])
            self.prefix_len += n
            self.pending = []
            self.tree.set_best(ROOT, best[0])
            self.tree.add_children(ROOT, p.topk, self.stop_ids)
            self.add_lookup()
        else:
            nodes = self.tree.frontier(p.width, stop_ids=self.stop_ids)
            if not nodes:
                return None
            rec = self._feed_nodes(nodes, phase)
            for i in nodes:
                self.tree.add_children(i, p.topk, self.stop_ids)
        self.tree.prune(p.budget, floor=p.floor)
        self.levels += 1
        return rec

    def add_lookup(self) -> None:
        """Merge the prompt-lookup continuations of the committed tokens into the active tree,
        each token scoring log of the request's learnt ``LookupStats.p`` (``rapid.runtime.lookup``;
        none with ``params.lookup == 0``). The caller prunes."""
        self._proposed = self._add_chains(self.tree)

    def _add_chains(self, tree: TokenTree) -> list[list[int]]:
        p = self.params
        chains = lookup_continuations(self.committed, p.lookup, p.lookup_branches)
        for cont in chains:
            tree.add_chain(cont, math.log(self.lookup.p), self.stop_ids)
        return chains

    def _lookup_tree(self) -> tuple[TokenTree, list[list[int]]]:
        """The lookup chains of the committed tokens alone, pruned as a drafted tree is."""
        tree = TokenTree()
        chains = self._add_chains(tree)
        tree.prune(self.params.budget, floor=self.params.floor)
        return tree, chains

    def lookup_round(self) -> None:
        """A round that drafts nothing (depth 0): the tree is the prompt-lookup chains alone
        (empty where nothing matches: the cloud then takes one target step). No engine step runs;
        the committed tokens stay pending, fed by the next round that drafts."""
        if self.levels:
            raise DraftStateError("a round without a draft step needs a tree with no drafted level")
        self.tree, self._proposed = self._lookup_tree()

    def lookup_outlook(self) -> tuple[list[float], int]:
        """Of the tree ``lookup_round`` would send now: P(its chains carry the accepted path to
        level k) for k = 1.. (``TokenTree.level_mass``: each lookup token scores log
        ``LookupStats.p``, the chains are disjoint), and its node count."""
        tree, _ = self._lookup_tree()
        return tree.level_mass(), len(tree)

    def _grow_branch(self, nodes: list[int], leaves: list[int] = ()) -> StepRecord:
        """Feed ``nodes`` of the branch (and, in the same forward, D_i's unfed ``leaves``, whose
        next tokens only become known), add the branch nodes' children, prune the branch's own
        nodes to the budget (D_i, sent to the cloud, and the roots stay intact). A node's score
        is its outcome's (the root's score + the path below it), so the roots share the budget
        by how likely they are; ``min_p`` is applied once a root is kept, to the re-rooted
        scores (``apply_verdict``), not to these."""
        rec = self._feed_nodes(list(leaves) + nodes, "leaf" if leaves else "branch")
        for i in nodes:
            self.tree.add_children(i, self.params.topk, self.stop_ids)
        self.roots.renumber(self.tree.prune(self.params.budget, among=self.roots.below(self.tree)))
        return rec

    def draft(self, depth: int, on_step: Callable[[StepRecord], None] | None = None,
              confidence_floor: float | None = None,
              pays: Callable[[float, int], bool] | None = None) -> list[StepRecord]:
        """Expand the active tree until it has ``depth`` levels (fewer if it cannot grow), stopping
        once the best frontier node's own draft probability falls below ``confidence_floor``
        (EdgeLLM-style fallback) or ``pays(*next_step_bound())`` says the next step cannot pay
        (``TreeCut.pays_to_grow``; asked before each step after the first)."""
        recs = []
        while self.levels < depth:
            if confidence_floor is not None and self.levels > 0 and self._confidence() < confidence_floor:
                break
            if pays is not None and self.levels > 0 and not pays(*(self.next_step_bound() or (0.0, 0))):
                break
            rec = self.step()
            if rec is None:
                break
            recs.append(rec)
            if on_step:
                on_step(rec)
        return recs

    def next_step_bound(self) -> tuple[float, int] | None:
        """(the best score of the nodes the next step feeds, the most nodes it adds: fed × topk):
        a child scores at most its parent. None before the first step or where nothing can grow."""
        if self.levels == 0:
            return None
        nodes = self.tree.frontier(self.params.width, stop_ids=self.stop_ids)
        if not nodes:
            return None
        return max(self.tree.score[i] for i in nodes), len(nodes) * self.params.topk

    def _confidence(self) -> float:
        best_one = self.tree.frontier(1, stop_ids=self.stop_ids)  # the best expandable node
        if not best_one:
            return 0.0
        best = best_one[0]
        par = self.tree.parents[best]
        return math.exp(self.tree.score[best] - (0.0 if par == ROOT else self.tree.score[par]))

    def cut(self, nodes: int) -> None:
        """Keep the ``nodes`` best nodes of the active tree (ancestor-closed; before it is sent)."""
        if nodes < len(self.tree):
            self.tree.prune(max(1, nodes))

    def lookup_flags(self) -> list[bool]:
        """Per node of the active tree: on a prompt-lookup continuation proposed this round."""
        child = {(p, t): i for i, (p, t) in enumerate(zip(self.tree.parents, self.tree.tokens, strict=True))}
        flags = [False] * len(self.tree)
        for cont in self._proposed:
            node: int | None = ROOT
            for tok in cont:
                node = child.get((node, tok))
                if node is None:
                    break
                flags[node] = True
        return flags

    def wire_tree(self) -> tuple[list[int], list[int]]:
        return list(self.tree.tokens), list(self.tree.parents)

    # ---- proactive branch (IPDG / NPDG) ------------------------------------------------------
    def save_boundary(self) -> Boundary:
        return Boundary(self.tree.copy(), self.engine.kv_len)

    def branch_hit(self, path: list[int], bonus: int) -> bool | None:
        """Did the proactive branch guess the verdict (one of its fed roots ends the accepted path
        and carries the bonus)? None when no root was chosen this round."""
        return self.branch_outcome(path, bonus) == "hit" if self.roots else None

    def branch_outcome(self, path: list[int], bonus: int) -> str:
        """Where the verdict (path, bonus) landed for this round's branch (``runtime.ipdg.branch_outcome``)."""
        return self.roots.outcome(self.tree, path, bonus)

    def branch_landing(self, path: list[int], bonus: int) -> int | None:
        """The branch step that feeds (or would feed) the root the verdict (path, bonus) lands on,
        fed or not (what a branch stopped before its roots were fed would have scored): 0 for the
        first step, 1 for a later one; None when it lands on no chosen root."""
        k = self.roots.landing(path, bonus)
        return None if k is None else self.roots.fed_by[k]

    def restore_boundary(self, b: Boundary) -> None:
        """Drop everything expanded after ``b``: the tree as saved, the KV extent as saved."""
        self.tree = b.tree.copy()
        self.engine.truncate(b.kv_len)
        self.roots.clear()

    def proactive_steps(self, width: int | None = None, second_wave: bool = True) -> Iterator[StepRecord]:
        """The proactive expansion steps, one at a time (the caller checks feedback between them
        and simply stops iterating to interrupt).

        Step 0 feeds, in one forward, the best unfed nodes of D_i (their next tokens become
        known; a prompt-lookup chain below one of them whole, ``TokenTree.with_chains``, so that
        a verdict accepting the chain to its end can land on a root) and the roots whose outcome
        is known already: the k = ``params.branch_roots`` likeliest verdicts that stop at the root
        or at a fed node. On a slow edge the verdict lands before a second step ends, so only
        these can be kept. Then, the leaves' next tokens known, the k likeliest outcomes not
        chosen yet are fed as roots too (a chain branch, ``width`` = 1, has only this one root,
        k = 1); then the best ``width`` nodes below any root per step, best first by score, so
        the likelier roots grow deeper.

        The first wave of roots is chosen here, before any step is asked for: a branch that the
        caller stops before its first step (``runtime.branch_gate``) is still judged on them, so
        the gate keeps learning how often they would have been kept.

        ``second_wave`` False: step 0 feeds the first wave's roots alone, no leaf, and no second
        wave follows (``BranchGate.second_wave``: its step could not end before the verdict).
        """
        self._branch_width = width or self.params.width
        k = 1 if width == 1 else self.params.branch_roots
        sent = len(self.tree)
        leaves = self.tree.with_chains(self.tree.frontier(self.params.width, stop_ids=self.stop_ids),
                                       self.stop_ids) if second_wave else []
        chain = width == 1 and bool(leaves)  # its one root is chosen once the leaves are known
        early = [] if chain else self.roots.hang(
            self.tree, choose_proactive_roots(self.tree, self.params.branch_decay, k, self.params.floor, sent), 0)
        return self._branch_steps(early, leaves, k, sent)

    def _branch_steps(self, early: list[int], leaves: list[int], k: int, sent: int) -> Iterator[StepRecord]:
        """``proactive_steps``' steps once the first wave (``early``) is chosen."""
        rec = self._grow_branch(early, leaves) if leaves or early else None
        late: list[int] = []
        if leaves:  # chosen before step 0 is handed out: the branch's best root is then known
            floor = self.params.floor if self.roots else -math.inf
            late = self.roots.hang(self.tree, [r for r in choose_proactive_roots(
                self.tree, self.params.branch_decay, k, self.params.floor, sent) if r.score >= floor], 1)
        if rec is not None:
            yield rec
        if late:
            yield self._grow_branch(late)
        if not self.roots:
            return
        while True:
            nodes = self.tree.frontier(self._branch_width, self.roots.below(self.tree), self.stop_ids)
            if not nodes:
                return
            yield self._grow_branch(nodes)

    # ---- verdict --------------------------------------------------------------------------
    def apply_verdict(self, path: list[int], bonus: int) -> VerdictPlan:
        """Commit path + bonus; keep the branch if it guessed right, else everything is dropped."""
        hit_root = self.roots.landing(path, bonus)
        levels_kept = 0 if hit_root is None else self.roots.levels(self.tree, hit_root)
        plan = plan_verdict(self.tree, path, bonus, self.prefix_len)
        self.lookup.observe(self._proposed, plan.emitted)
        self._proposed = []
        self.engine.compact(plan.keep_slots, self.prefix_len)
        self.prefix_len += plan.prefix_grow
        self.transcript.commit(plan.emitted)
        self.pending = self.pending + plan.pending  # after a round that drafted nothing the root
        # was never fed: what was pending then still is, before this verdict's tokens
        self.tree = plan.next_tree
        self.levels = levels_kept if plan.hit and plan.next_tree.root_top is not None else 0
        self.roots.clear()
        if self.levels:  # a kept branch skips step 0, where lookup candidates join a new tree
            self.tree.regrow_children(self.params.topk, self.stop_ids)  # lost to the other roots
            self.add_lookup()
            self.tree.prune(self.params.budget, floor=self.params.floor)
        return plan
