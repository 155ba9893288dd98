"""rapid.runtime.drafter over a real tiny draft (TorchEngine) behind a recording wrapper: what
each step feeds and sees, the KV invariants of the module docstring, verdicts and the boundary
save/restore. The wrapper only observes: every call goes to the real engine, which computes the
logits; it mirrors which token each KV slot holds so a test can read what a row attends to."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.core.acceptance import validate_tree
from rapid.core.geometry import ROOT
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.drafter import Drafter, DraftStateError, StepTimeoutError
from rapid.runtime.tree import TreeParams
from rapid.tiny import EOS_ID, VOCAB


class Recording:
    """A real engine plus the token in each of its KV slots, and per step the fed tokens and the
    tokens each row may attend to."""

    def __init__(self, inner: TorchEngine) -> None:
        self.inner = inner
        self.info = inner.info
        self.slots: list[int] = []
        self.seen: list[tuple[list[int], list[list[int]]]] = []

    @property
    def kv_len(self) -> int:
        assert self.inner.kv_len == len(self.slots)
        return self.inner.kv_len

    def step(self, tokens, positions, allowed, rows=None):
        handle = self.inner.step(tokens, positions, allowed, rows)
        self.slots += list(tokens)
        self.seen.append((list(tokens), [[self.slots[j] for j in np.flatnonzero(a)] for a in allowed]))
        return handle

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)
        del self.slots[length:]

    def compact(self, src_slots, dst_start: int) -> None:
        self.inner.compact(src_slots, dst_start)
        moved = [self.slots[s] for s in src_slots]
        self.slots[dst_start:] = moved

    def reset(self) -> None:
        self.inner.reset()
        self.slots = []


@pytest.fixture
def engine(tiny_pair):
    _, drafts = tiny_pair
    return lambda: Recording(TorchEngine(drafts["partial"], capacity=256))


def path_tokens(d: Drafter, node: int) -> list[int]:
    return [d.tree.tokens[i] for i in d.tree.path(node)]


def test_every_row_sees_the_committed_prefix_and_its_own_path(engine):
    eng = engine()
    d = Drafter(eng, TreeParams(depth=3, budget=8, topk=2, width=2))
    prompt = [1, 2, 3, 4]
    d.start(prompt)
    d.draft(3)
    fed, seen = eng.seen[0]
    assert fed == prompt and seen == [prompt[: r + 1] for r in range(len(prompt))]  # causal prefill
    slot_of = {s: i for i, s in enumerate(d.tree.slot) if s >= 0}
    kv, checked = len(prompt), 0
    for fed, seen in eng.seen[1:]:
        for r, row in enumerate(seen):
            node = slot_of[kv + r]  # the node fed in this row
            assert fed[r] == d.tree.tokens[node] and row == prompt + path_tokens(d, node)
            checked += 1
        kv += len(fed)
    assert checked >= 3


def test_tree_is_valid_and_kv_invariants_hold(engine):
    eng = engine()
    p = TreeParams(depth=4, budget=10, topk=3, width=2)
    d = Drafter(eng, p)
    d.start([5, 6, 7])
    d.draft(4)
    tokens, parents = d.wire_tree()
    assert validate_tree(tokens, parents, VOCAB, p.budget) is None and len(tokens) <= p.budget
    fed = [s for s in d.tree.slot if s >= 0]
    assert all(s >= d.prefix_len for s in fed) and eng.kv_len == d.prefix_len + len(fed)
    for i, s in enumerate(d.tree.slot):
        if s >= 0:
            assert eng.slots[s] == d.tree.tokens[i]


def test_verdict_commits_path_and_bonus_and_keeps_the_prefix_kv(engine):
    eng = engine()
    d = Drafter(eng, TreeParams(depth=3, budget=8, topk=2, width=2))
    prompt = [9, 8, 7]
    d.start(prompt)
    d.draft(3)
    first = d.tree.children(-1)[0]
    plan = d.apply_verdict([first], 11)
    assert plan.emitted == [d.committed[-2], 11] and d.committed == prompt + plan.emitted
    assert eng.kv_len == d.prefix_len and eng.slots == d.committed[: d.prefix_len]
    assert d.committed[d.prefix_len:] == d.pending  # committed tokens whose KV is not computed yet
    d.draft(2)  # the next round starts by feeding the pending tokens
    assert eng.slots[: len(d.committed)] == d.committed


def test_restore_boundary_drops_the_branch(engine):
    eng = engine()
    d = Drafter(eng, TreeParams(depth=2, budget=6, topk=2, width=2))
    d.start([3, 4])
    d.draft(2)
    before_tree, before_kv = d.tree.copy(), eng.kv_len
    boundary = d.save_boundary()
    for _ in d.proactive_steps():
        pass
    assert eng.kv_len > before_kv
    d.restore_boundary(boundary)
    assert eng.kv_len == before_kv and d.tree.tokens == before_tree.tokens and d.tree.slot == before_tree.slot


def test_a_branch_with_no_outcome_known_before_its_first_step_still_runs(engine):
    """Every token the root's step ranked is already a child (as when a lookup chain takes the
    slot of the draft's third choice) and no other node is fed: no root can be chosen before the
    first step, which then feeds the leaves alone and chooses the roots after it."""
    d = Drafter(engine(), TreeParams(depth=1, budget=6, topk=2, width=2, lookup=0, branch_roots=3, branch_decay=1.0))
    d.start([3, 4])
    d.draft(1)
    third, lp = d.tree.root_top[2]
    d.tree.add_node(third, ROOT, 1, lp)
    steps = d.proactive_steps()
    next(steps)
    assert d.roots.roots and set(d.roots.fed_by) == {1}  # every root is second-wave: chosen once the leaves were fed


@pytest.mark.parametrize("roots, width", [(1, 1), (3, 2)])
def test_proactive_branch_first_level_respects_the_budget(engine, roots, width):
    """The roots' children become D_{i+1}'s first level: pruned to the budget like every later
    level, over all roots together (found by the bf16 exactness property test: edgellm with
    budget 1 sent a 2-node tree)."""
    d = Drafter(engine(), TreeParams(depth=1, budget=1, topk=2, width=width, branch_roots=roots))
    d.start([3, 4, 5])
    d.draft(1)
    for _ in d.proactive_steps(width=width):
        assert len(d.roots.nodes) in (0, len(d.roots.roots)) and len(d.roots.roots) <= (1 if width == 1 else 2 * roots)  # k known, k once leaves are fed
        under = [i for i in range(len(d.tree)) if set(d.roots.nodes).intersection(d.tree.path(i)[:-1])]
        assert len(under) <= 1


class NeverReady:
    """A handle whose step never completes (a wedged device)."""

    def __init__(self, inner) -> None:
        self.inner, self.polls = inner, 0

    def ready(self) -> bool:
        self.polls += 1
        return False

    def logits(self):
        raise AssertionError("logits read from a step that never completed")


def test_a_step_that_never_completes_raises_a_typed_error(engine):
    eng = engine()
    handles = []
    real_step = eng.step

    def step(*a, **kw):
        handles.append(NeverReady(real_step(*a, **kw)))
        return handles[-1]

    eng.step = step
    d = Drafter(eng, TreeParams(3, 10, 2, 2), poll_s=0.001, ready_timeout_s=0.05)
    d.start([1, 2, 3])
    with pytest.raises(StepTimeoutError, match="not complete after 0.05 s"):
        d.draft(3)
    assert len(handles) == 1 and handles[0].polls > 5  # polled while waiting, then gave up
    with pytest.raises(ValueError, match="poll_s"):
        Drafter(eng, TreeParams(), poll_s=0.0)


def test_a_lookup_chain_is_fed_whole_in_the_branchs_first_step_and_its_end_can_be_kept(engine):
    """A verdict that accepts a prompt-lookup chain to its end lands below a node the draft never
    fed while drafting D_i; the branch's first step feeds the chain in one forward (each row sees
    the prefix and its own path), so a root can hang below the chain's end and be kept."""
    eng = engine()
    d = Drafter(eng, TreeParams(depth=1, budget=16, topk=2, width=2, lookup=4, lookup_p=1.0))
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    d.start(prompt)
    d.draft(1)
    chain, node = [], -1
    for t in (8, 9, 10, 5):  # the continuation of the repeated 3-gram [5, 6, 7]
        node = d.tree.child_with(node, t)
        chain.append(node)
    assert all(d.tree.slot[i] < 0 for i in chain)  # D_i as sent: the chain unfed
    steps = d.proactive_steps()
    next(steps)
    fed, seen = eng.seen[-1]
    rows = {d.tree.slot[i] - (eng.kv_len - len(fed)): i for i in chain}
    assert all(d.tree.slot[i] >= 0 and d.tree.top[i] is not None for i in chain)
    for r, i in rows.items():
        assert fed[r] == d.tree.tokens[i] and seen[r] == prompt + path_tokens(d, i)
    next(steps)  # the roots chosen once the chain's end is known are fed
    root = d.roots.roots[0]
    assert root.node == chain[-1]
    plan = d.apply_verdict(chain, root.token)
    assert plan.hit and plan.emitted == [8, 9, 10, 5, root.token] and d.levels >= 1
    assert eng.slots[: d.prefix_len] == d.committed[: d.prefix_len]
    d.draft(d.levels + 1)
    for i, s in enumerate(d.tree.slot):
        if s >= 0:
            assert eng.slots[s] == d.tree.tokens[i]


def test_a_kept_branch_is_pruned_as_a_fresh_tree_of_its_fed_nodes_would_be(engine):
    """While D_{i+1} grows its roots share one budget, so the kept root's fed nodes may have lost
    their children to other roots' nodes. After the verdict keeps it, every fed node (and the new
    root) has its best ``topk`` next tokens as children again, unless the budget is full of nodes
    scoring at least as high: the tree could otherwise not grow (no unfed node) and the round sent a
    chain of 1-2 nodes. Over 30 prompts of the tiny pair, without the regrowth 59 such children
    were missing."""
    params = TreeParams(depth=2, budget=6, topk=2, width=2, lookup=0, branch_roots=3, branch_decay=1.0)
    kept = 0
    for seed in range(30):
        d = Drafter(engine(), params)
        d.start([(seed * 7 + k * 13) % 50 + 3 for k in range(6)])
        d.draft(2)
        for _ in zip(range(3), d.proactive_steps(), strict=False):
            pass
        k = next((k for k in range(len(d.roots.roots)) if d.roots.levels(d.tree, k) >= 2), None)
        if k is None:
            continue
        r = d.roots.roots[k]
        assert d.apply_verdict([] if r.node == ROOT else d.tree.path(r.node), r.token).hit
        kept += 1
        t = d.tree
        lowest = min(t.score)
        for i in [ROOT] + [j for j in range(len(t)) if t.slot[j] >= 0]:
            base = 0.0 if i == ROOT else t.score[i]
            for tok, lp in (t.root_top if i == ROOT else t.top[i])[: params.topk]:
                assert t.child_with(i, tok) is not None or (len(t) == params.budget and base + lp <= lowest)
    assert kept >= 20


def test_rounds_that_draft_nothing_leave_the_committed_tokens_pending_for_the_next_step(engine):
    """Two rounds without a draft step (``lookup_round``: the lookup chains alone), the second
    accepting two tokens of a chain: nothing is fed, every committed token past the prefix's KV
    stays pending, the next drafted round feeds them all in its first step, and its tree is the
    one a drafter that had drafted all along would build (same prefix KV, same ranked children)."""
    eng = engine()
    params = TreeParams(depth=2, budget=12, topk=2, width=2, lookup=4)
    d = Drafter(eng, params)
    prompt = [3, 4, 5, 6, 3, 4, 5]  # "3 4 5" again: the lookup proposes 6 3 4 5
    d.start(prompt)
    d.prefill()
    reach, nodes = d.lookup_outlook()  # p = the prior 0.5 a token, before any verdict
    assert nodes == 4 and reach == pytest.approx([0.5, 0.25, 0.125, 0.0625])
    d.lookup_round()
    assert d.wire_tree()[0] == [6, 3, 4, 5] and eng.seen[-1][0] == prompt[:-1]  # no step ran
    plan = d.apply_verdict([0, 1], 9)  # accepts 6 3 of the chain, then the target says 9
    assert plan.emitted == [6, 3, 9] and d.pending == [5, 6, 3, 9]
    d.lookup_round()
    d.apply_verdict([], 8)
    assert d.committed == prompt + [6, 3, 9, 8] and d.pending == [5, 6, 3, 9, 8] and eng.kv_len == d.prefix_len
    d.draft(2)
    assert eng.seen[1][0] == [5, 6, 3, 9, 8] and eng.slots[: len(d.committed)] == d.committed
    fresh = Drafter(engine(), params)
    fresh.start(d.committed)
    fresh.prefill()
    fresh.draft(2)
    assert d.wire_tree() == fresh.wire_tree()
    # the draft's numerics are not the product's (the cloud decides): equal ranks, scores close
    ranks = [[t for t, _ in top or []] for top in d.tree.top + [d.tree.root_top]]
    assert ranks == [[t for t, _ in top or []] for top in fresh.tree.top + [fresh.tree.root_top]]
    assert d.tree.score == pytest.approx(fresh.tree.score, abs=1e-4)
    with pytest.raises(DraftStateError):
        d.lookup_round()  # a tree with drafted levels is not a round that drafts nothing


def test_without_a_second_wave_the_first_step_feeds_the_first_roots_alone(engine):
    """On a slow edge a second branch step ends after the verdict (``BranchGate.second_wave``):
    step 0 then feeds no leaf of D_i, only the roots whose outcome is known, and no root waits on
    a leaf's next tokens."""
    eng = engine()
    d = Drafter(eng, TreeParams(depth=2, budget=6, topk=2, width=2, lookup=0, branch_roots=3, branch_decay=1.0))
    d.start([3, 4])
    d.draft(2)
    unfed = [i for i in range(len(d.tree)) if d.tree.slot[i] < 0]
    steps = d.proactive_steps(second_wave=False)
    next(steps)
    fed, _ = eng.seen[-1]
    assert unfed and len(fed) == len(d.roots.roots) == 3 and set(d.roots.fed_by) == {0}
    assert all(d.tree.slot[i] < 0 for i in unfed)  # D_i's leaves: still unfed
    both = Drafter(engine(), TreeParams(depth=2, budget=6, topk=2, width=2, lookup=0, branch_roots=3,
                                        branch_decay=1.0))
    both.start([3, 4])
    both.draft(2)
    next(both.proactive_steps())
    assert len(both.engine.seen[-1][0]) == 3 + 2  # the default: the width (2) best leaves ride in step 0


def test_drafting_stops_where_a_step_cannot_pay(tiny_pair):
    """``draft(pays=...)`` asks before each step after the first, with an upper bound of what the
    step adds: no step where it says no; as planned where it says yes. No node the next step adds
    scores above the bound, and it adds at most the bound's count."""
    _, drafts = tiny_pair
    asked: list[tuple[float, int]] = []
    for verdict, levels in ((False, 1), (True, 4)):
        d = Drafter(TorchEngine(drafts["partial"], capacity=256), TreeParams(4, 32, 2, 2), (EOS_ID,))
        d.start(list(b"the cat sat on"))
        d.prefill()
        assert d.next_step_bound() is None  # the root's step always runs
        d.draft(4, pays=lambda b, k, v=verdict: asked.append((b, k)) or v)
        assert d.levels == levels
    for _ in range(3):
        bound, added = d.next_step_bound()
        before = len(d.tree)
        d.step()
        new = range(before, len(d.tree))
        assert len(new) <= added and all(d.tree.score[i] <= bound for i in new)
    assert len(asked) == 1 + 3  # once before each step after the first
