"""IPDG on a real (tiny) draft: interruption at step boundaries, exact restore, branch reuse."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.target import TargetSession
from rapid.tiny import EOS_ID


class CountingEngine(TorchEngine):
    """A real TorchEngine that counts steps and can fire a callback while a step runs."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = 0
        self.during_step = None

    def step(self, *a, **kw):
        self.calls += 1
        if self.during_step:
            self.during_step(self.calls)
        return super().step(*a, **kw)


class FlagLink:
    """Only the feedback flag of a CloudLink: what the branch loop reads between steps."""

    def __init__(self):
        self.feedback = threading.Event()


class LateHandle:
    """A step that completes ``delay`` s after its launch returned, as a GPU step would: until
    then ``ready()`` is False, and reading its logits is a bug (a torn output buffer), recorded."""

    def __init__(self, inner, delay, log):
        self.inner, self.done_at, self.log = inner, time.perf_counter() + delay, log

    def ready(self):
        return time.perf_counter() >= self.done_at

    def logits(self):
        if not self.ready():
            self.log.append("logits before ready")
            time.sleep(max(0.0, self.done_at - time.perf_counter()))
        return self.inner.logits()


class LateEngine(TorchEngine):
    """A real TorchEngine whose handles become ready ``delay`` s after ``step`` returns."""

    def __init__(self, *a, delay=0.02, **kw):
        super().__init__(*a, **kw)
        self.delay, self.handles, self.log = delay, [], []
        self.during_step = None

    def step(self, *a, **kw):
        handle = LateHandle(super().step(*a, **kw), self.delay, self.log)
        self.handles.append(handle)
        if self.during_step:
            self.during_step(len(self.handles))
        return handle


class ReadLog(threading.Event):
    """A feedback flag that records when it is read."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def is_set(self):
        self.reads.append(time.perf_counter())
        return super().is_set()


PARAMS = TreeParams(3, 10, 2, 2)


def drafted(draft, prompt=b"abc def", params=PARAMS):
    eng = CountingEngine(draft, capacity=512)
    d = Drafter(eng, params, (EOS_ID,))
    d.start(list(prompt))
    d.draft(params.depth)
    return eng, d


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 5))
def test_feedback_during_step_k_completes_exactly_k_steps(tiny_pair, k):
    _, drafts = tiny_pair
    eng, d = drafted(drafts["partial"])
    link = FlagLink()
    coord = Coordinator(d, link, POLICIES["ipdg"], CoordinatorConfig(depth=8))
    start = eng.calls
    eng.during_step = lambda n: link.feedback.set() if n - start == k else None
    steps, interrupted_at = coord._branch(depth=8)
    assert steps == k and interrupted_at == k
    assert eng.calls - start == k  # no step k+1 was started


@pytest.mark.parametrize("k", [1, 3])
def test_the_flag_is_read_only_after_the_step_completes(tiny_pair, k):
    """The engine's launch returns at once and the step completes 20 ms later: the drafter
    waits for ready() before it touches the logits, and the flag set during step k is read
    only once step k is complete; no step k+1 is launched."""
    _, drafts = tiny_pair
    eng = LateEngine(drafts["partial"], capacity=512)
    d = Drafter(eng, PARAMS, (EOS_ID,))
    d.start(list(b"abc def"))
    d.draft(PARAMS.depth)
    link = FlagLink()
    link.feedback = ReadLog()
    start = len(eng.handles)
    eng.during_step = lambda n: link.feedback.set() if n - start == k else None
    steps, interrupted_at = Coordinator(d, link, POLICIES["ipdg"], CoordinatorConfig(depth=8))._branch(depth=8)
    assert (steps, interrupted_at) == (k, k) and len(eng.handles) - start == k
    assert eng.log == []  # logits were read only from completed steps
    branch = eng.handles[start:]
    assert len(link.feedback.reads) == k
    for read, handle in zip(link.feedback.reads, branch, strict=True):
        assert read >= handle.done_at  # the flag after step j is read once step j is complete


def test_npdg_ignores_feedback_and_runs_to_depth(tiny_pair):
    _, drafts = tiny_pair
    eng, d = drafted(drafts["partial"])
    link = FlagLink()
    link.feedback.set()
    steps, interrupted_at = Coordinator(d, link, POLICIES["npdg"], CoordinatorConfig(depth=3))._branch(depth=3)
    assert interrupted_at is None
    assert d.roots.levels(d.tree) == 3 and steps >= 3


@pytest.mark.parametrize("n_steps", [1, 2, 4])
def test_restore_is_bit_identical(tiny_pair, n_steps):
    _, drafts = tiny_pair
    eng, d = drafted(drafts["partial"])
    b = d.save_boundary()
    tree_before = d.tree.copy()
    kv_len = eng.kv_len
    k_before = eng.kv.k[:, :, :kv_len].clone()
    v_before = eng.kv.v[:, :, :kv_len].clone()
    for i, _ in enumerate(d.proactive_steps()):
        if i + 1 == n_steps:
            break
    assert eng.kv_len > kv_len and d.tree != tree_before
    d.restore_boundary(b)
    assert eng.kv_len == kv_len
    assert d.tree == tree_before
    assert bool((eng.kv.k[:, :, :kv_len] == k_before).all()) and bool((eng.kv.v[:, :, :kv_len] == v_before).all())


@pytest.mark.parametrize("draft_name", ["same", "partial"])
def test_kept_branch_equals_fresh_drafting(tiny_pair, draft_name):
    """After a proactive hit, every kept node's next tokens and score are the ones a draft run
    from scratch on its path gives, and the kept KV equals a fresh one's (the branch shares its
    budget with the other roots, so the kept tree may be smaller than a fresh tree)."""
    _, drafts = tiny_pair
    draft = drafts[draft_name]
    params = TreeParams(3, 10, 2, 2)
    eng, d = drafted(draft, params=params)
    steps = list(zip(range(4), d.proactive_steps(), strict=False))
    assert len(steps) == 4 and d.roots.best is not None
    br = d.roots.best
    path = d.tree.path(br.node) if br.node >= 0 else []
    d.apply_verdict(path, br.token)  # the verdict the branch guessed
    assert d.levels >= 2
    t = d.tree
    assert [x for x, _ in t.root_top] == _fresh_top(draft, d.committed, 2)
    fed = [i for i in range(len(t)) if t.slot[i] >= 0]
    assert fed
    for i in fed:
        toks = [t.tokens[j] for j in t.path(i)]
        assert [x for x, _ in t.top[i]] == _fresh_top(draft, d.committed + toks, 2)
        parent_top = t.root_top if t.parents[i] < 0 else t.top[t.parents[i]]
        lp = dict(parent_top)[t.tokens[i]]
        base = 0.0 if t.parents[i] < 0 else t.score[t.parents[i]]
        assert t.score[i] == pytest.approx(base + lp, abs=1e-5)  # draft log-probs are float32
    # the KV the kept branch carries equals the fresh one for the committed prefix
    fresh_eng = TorchEngine(draft, capacity=512)
    fresh = Drafter(fresh_eng, params, (EOS_ID,))
    fresh.start(d.committed)
    fresh.draft(1)
    assert d.prefix_len == len(d.committed) and fresh.prefix_len == len(fresh.committed)
    n = d.prefix_len
    assert float((eng.kv.k[:, :, :n] - fresh_eng.kv.k[:, :, :n]).abs().max()) < 1e-9


@pytest.mark.parametrize("roots", [1, 3])
def test_branch_then_verdict_round_trip_is_exact(tiny_pair, roots):
    """Drive rounds by hand with an in-process target: hits (on any root) and misses both commit
    target tokens, and the draft KV stays consistent."""
    target, drafts = tiny_pair
    sp = SamplingParams()
    prompt = list(b"round trip")
    session = TargetSession(target, prompt, sp)
    eng = CountingEngine(drafts["partial"], capacity=1024)
    d = Drafter(eng, TreeParams(3, 8, 2, 2, branch_roots=roots), (EOS_ID,))
    d.start(prompt)
    hits = 0
    for _ in range(12):
        d.draft(3)
        toks, par = d.wire_tree()
        b = d.save_boundary()
        for _, _ in zip(range(3), d.proactive_steps(), strict=False):
            pass
        assert 1 <= len(d.roots.roots) <= 2 * roots  # k known outcomes, then k more once the leaves are fed
        v = session.verify(toks, par)
        if not d.branch_hit(list(v.path), v.bonus):
            d.restore_boundary(b)
        plan = d.apply_verdict(list(v.path), v.bonus)
        hits += plan.hit
        assert d.committed == session.tokens
        assert eng.kv_len == d.prefix_len + sum(s >= 0 for s in d.tree.slot)
    assert hits > 0


def _fresh_top(draft, tokens: list[int], k: int) -> list[int]:
    """The draft's best k next tokens after ``tokens``, computed from scratch (causal)."""
    fresh = Drafter(TorchEngine(draft, capacity=512), TreeParams(1, 4, k, 1, lookup=0), (EOS_ID,))
    fresh.start(tokens)
    fresh.step()
    return [t for t, _ in fresh.tree.root_top]


def test_a_hit_on_a_later_root_keeps_that_roots_subtree_with_its_own_kv(tiny_pair):
    """Several roots: a verdict landing on the second one keeps exactly its subtree, and every kept
    fed node's next tokens are those a fresh draft computes for its path (the KV was remapped
    right), so the next round drafts on from the kept levels."""
    _, drafts = tiny_pair
    draft = drafts["partial"]
    params = TreeParams(2, 12, 2, 2, lookup=0, branch_roots=3)
    eng, d = drafted(draft, params=params)
    for _ in zip(range(3), d.proactive_steps(), strict=False):
        pass
    assert len(d.roots.roots) >= 2
    second, node = d.roots.roots[1], d.roots.nodes[1]
    expect = [d.tree.tokens[i] for i in d.tree.path(node)] + [d.tree.tokens[i] for i in d.roots.below(d.tree)
                                                                if node in d.tree.path(i)]
    path = d.tree.path(second.node) if second.node >= 0 else []
    assert d.branch_hit(path, second.token)
    d.apply_verdict(path, second.token)
    assert d.levels >= 1 and d.committed[-1] == second.token
    assert sorted(d.tree.tokens) == sorted(expect[len(path) + 1:])
    assert [t for t, _ in d.tree.root_top] == _fresh_top(draft, d.committed, 2)
    for i in range(len(d.tree)):
        if d.tree.slot[i] >= 0:
            got = [t for t, _ in d.tree.top[i]]
            assert got == _fresh_top(draft, d.committed + [d.tree.tokens[j] for j in d.tree.path(i)], 2)
    assert eng.kv_len == d.prefix_len + sum(s >= 0 for s in d.tree.slot)


def test_each_root_names_the_branch_step_that_feeds_it(tiny_pair):
    """Roots come in two waves: the outcomes known before the branch (inside D_i) are fed by its
    first step, those at D_i's leaves by the second. ``branch_landing`` names the wave of the root
    a verdict lands on (what the branch gate learns from), None for a verdict on no root."""
    _, drafts = tiny_pair
    params = TreeParams(2, 12, 2, 2, lookup=0, branch_roots=3, branch_decay=1.0)
    _, d = drafted(drafts["partial"], params=params)
    steps = d.proactive_steps()
    next(steps)
    assert sorted(set(d.roots.fed_by)) == [0, 1]  # both waves chosen once the first step is handed out
    fed = [d.tree.slot[n] >= 0 for n in d.roots.nodes]
    assert fed == [w == 0 for w in d.roots.fed_by]
    next(steps)
    assert all(d.tree.slot[n] >= 0 for n in d.roots.nodes)
    for root, wave in zip(d.roots.roots, d.roots.fed_by, strict=True):
        path = d.tree.path(root.node) if root.node >= 0 else []
        assert d.branch_landing(path, root.token) == wave
    top = d.tree.root_top or []
    kids = {d.tree.tokens[i] for i in d.tree.children(-1)} | {r.token for r in d.roots.roots if r.node < 0}
    other = next(t for t in range(256) if t not in kids and t not in [x for x, _ in top])
    assert d.roots.roots and d.branch_landing([], other) is None  # roots chosen, none of them the verdict's
