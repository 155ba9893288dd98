"""Batch invariance of the target: is every row of a tree forward bitwise a one-token step?

Exactness of tree verification rests on this. For a tree ``[root] + nodes`` over a committed
prefix ``x``, row ``r`` of the tree forward must equal (``np.array_equal`` on the logits) the
row of a target-alone step that feeds the same token after the same prefix:

    tree_logits[0]     ==  step(x)                       (the root's row)
    tree_logits[1 + j] ==  step(x + path(j))             (path(j): root's child … node j)

and, for a batch of sessions, each session's rows in the batched forward equal its rows alone.

On the CPU the target runs ``rapid.server.row_forward``, whose kernels make this true by
construction; there ``probe`` only *confirms* it cheaply (a wrong build, say). Elsewhere (a
CUDA target, float64, no native library) library kernels promise nothing, so
``thorough_probe`` measures what the stress test measures: every row count 1 … budget + 1, key
lengths across 64 / 128 / 256, and a batch of sessions — and ``rapid serve`` verifies
sequentially unless all of it is bitwise. Random token ids are used: the arithmetic, not the
text, matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rapid.core.acceptance import Verdict
from rapid.core.sampling import SamplingParams
from rapid.modeling import Decoder
from rapid.server import row_forward, rowops
from rapid.server.chains import forward_chains
from rapid.server.target import TargetSession

PROBE_PREFIXES = (60, 120, 250)  # thorough_probe: prefix lengths whose trees cross 64, 128 and 256 keys


@dataclass(slots=True, frozen=True)
class RowCheck:
    rows: int  # rows compared
    differing: int  # rows not bitwise equal
    max_abs_diff: float  # largest |Δ logit| over all rows

    @property
    def invariant(self) -> bool:
        return self.differing == 0

    def merge(self, other: RowCheck) -> RowCheck:
        return RowCheck(self.rows + other.rows, self.differing + other.differing,
                        max(self.max_abs_diff, other.max_abs_diff))


NO_ROWS = RowCheck(0, 0, 0.0)


def compare_rows(got: np.ndarray, want: Sequence[np.ndarray]) -> RowCheck:
    diff = [float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want, strict=True)]
    bad = sum(not np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    return RowCheck(len(diff), bad, max(diff, default=0.0))


def _session(model: Decoder, prompt: Sequence[int], nodes: int) -> TargetSession:
    return TargetSession(model, prompt, SamplingParams(), capacity=len(prompt) + nodes + 4, max_nodes=max(1, nodes))


def step_rows(session: TargetSession, tokens: Sequence[int], parents: Sequence[int]) -> list[np.ndarray]:
    """The one-token-step logits every row of the tree must reproduce, by a depth-first walk of
    target-alone steps from ``session`` (one step per tree row; ``session`` is left as it was)."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        children.setdefault(p, []).append(j)
    want: list[np.ndarray | None] = [None] * (1 + len(tokens))

    def visit(row: int, node: int) -> None:  # the session's last token is the token of ``row``
        result = session.forward_tree([], [])
        want[row] = session.logits(result)[0]
        n_tokens, n_kv = len(session.tokens), session.kv.length
        for child in children.get(node, []):
            session.commit(result, Verdict((), int(tokens[child])), [])  # the row's KV + the child's token
            visit(1 + child, child)
            del session.tokens[n_tokens:]
            session.kv.truncate(n_kv)

    visit(0, -1)
    return want  # type: ignore[return-value]


def compare_tree(model: Decoder, prompt: Sequence[int], tokens: Sequence[int],
                 parents: Sequence[int]) -> RowCheck:
    """Rows of one tree forward vs the target-alone steps of their prefixes (bitwise)."""
    s = _session(model, prompt, len(tokens))
    got = s.logits(s.forward_tree(tokens, parents))
    return compare_rows(got, step_rows(s, tokens, parents))


def compare_batch(model: Decoder, trees: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> RowCheck:
    """Each (prompt, tokens, parents) tree in one batched forward vs its target-alone steps."""
    sessions = [_session(model, p, len(t)) for p, t, _ in trees]
    results = forward_chains(model, [s.chain_job(t, par) for s, (_, t, par) in zip(sessions, trees, strict=True)],
                             sessions[0].min_rows)
    check = NO_ROWS
    for s, (_, t, par), result in zip(sessions, trees, results, strict=True):
        check = check.merge(compare_rows(s.logits(result), step_rows(s, t, par)))
    return check


def compare_chain_prefixes(model: Decoder, prompt: Sequence[int], chain: Sequence[int]) -> RowCheck:
    """Every row count at once: the forwards of the chain's first 0, 1, … n nodes (1 … n + 1
    rows) against one walk of target-alone steps along the chain."""
    s = _session(model, prompt, len(chain))
    parents = list(range(-1, len(chain) - 1))
    want = step_rows(s, chain, parents)
    check = NO_ROWS
    for n in range(len(chain) + 1):
        check = check.merge(compare_rows(s.logits(s.forward_tree(chain[:n], parents[:n])), want[:n + 1]))
    return check


def _ids(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, vocab, n)]


def probe(model: Decoder, seed: int = 0, prefix: int = 12) -> RowCheck:
    """A chain of 4, a branching tree of 5, and a batch of three uneven trees, on random tokens."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    chain = (_ids(rng, vocab, prefix), _ids(rng, vocab, 4), [-1, 0, 1, 2])
    branchy = (_ids(rng, vocab, prefix + 3), _ids(rng, vocab, 5), [-1, -1, 0, 0, 2])
    check = compare_tree(model, *chain).merge(compare_tree(model, *branchy))
    return check.merge(compare_batch(model, [chain, (_ids(rng, vocab, prefix - 5), _ids(rng, vocab, 2), [-1, 0]),
                                             branchy]))


def thorough_probe(model: Decoder, budget: int, seed: int = 0,
                   prefixes: Sequence[int] = PROBE_PREFIXES) -> RowCheck:
    """Every row count 1 … ``budget`` + 1 after each prefix length, then a batch of three
    sessions (their trees together past 32 rows where the budget allows)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    check = NO_ROWS
    for p in prefixes:
        check = check.merge(compare_chain_prefixes(model, _ids(rng, vocab, p), _ids(rng, vocab, budget)))
    batch = []
    for p in prefixes:
        n = max(1, budget)
        batch.append((_ids(rng, vocab, p), _ids(rng, vocab, n), [int(rng.integers(-1, j)) for j in range(n)]))
    return check.merge(compare_batch(model, batch))


@dataclass(slots=True, frozen=True)
class Invariance:
    """How the verify mode was decided: by construction (the row kernels) or by measurement."""

    construction: str  # "row-invariant kernels (<isa>)", or "" where library kernels run
    check: RowCheck  # what the start-up probe compared

    def line(self) -> str:
        c = self.check
        what = f"{c.rows} rows compared, {c.differing} differ"
        if self.construction:
            return f"tree rows bitwise by construction ({self.construction}); start-up check: {what}"
        return f"library kernels (invariance measured, not constructed): {what}"


def check_invariance(model: Decoder, budget: int) -> Invariance:
    """The start-up check ``rapid serve`` and ``rapid doctor`` run: the cheap ``probe`` where the
    row kernels give invariance by construction, ``thorough_probe`` up to ``budget`` elsewhere."""
    if row_forward.enabled(model):
        return Invariance(f"row-invariant kernels, {rowops.info().isa}", probe(model))
    return Invariance("", thorough_probe(model, budget))
