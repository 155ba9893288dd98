"""Batch invariance of the target: is every row of a tree forward bitwise a one-token step?

Exactness of tree verification rests on this. For a tree ``[root] + nodes`` over a committed
prefix ``x``, row ``r`` of the tree forward must equal (``np.array_equal`` on the logits) the
row of a target-alone step that feeds the same token after the same prefix:

    tree_logits[0]     ==  step(x)                       (the root's row)
    tree_logits[1 + j] ==  step(x + path(j))             (path(j): root's child … node j)

and, for a batch of sessions, each session's rows in the batched forward equal its rows alone.

On the CPU the target runs ``rapid.server.row_forward``, whose kernels make this true by
construction; there ``probe`` only *confirms* it cheaply (a wrong build, say). Elsewhere (a
CUDA target, float64, no native library) ``rapid.server.block_forward`` calls library kernels
at fixed shapes only, which leaves one thing a row's arithmetic could depend on: its position in
a block. ``position_probe`` enumerates those positions for every key-slot count up to the
context, and ``rapid serve`` verifies sequentially unless all of it is bitwise. Random token ids
are used: the arithmetic, not the text, matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rapid.core.acceptance import Verdict
from rapid.core.sampling import SamplingParams
from rapid.engines import rowops
from rapid.modeling import Decoder
from rapid.server import block_forward, row_forward
from rapid.server.chains import forward_chains
from rapid.server.target import TargetSession


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
    results = forward_chains(model, [s.chain_job(t, par) for s, (_, t, par) in zip(sessions, trees, strict=True)])
    check = NO_ROWS
    for s, (_, t, par), result in zip(sessions, trees, results, strict=True):
        check = check.merge(compare_rows(s.logits(result), step_rows(s, t, par)))
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


def position_probe(model: Decoder, context: int, seed: int = 0) -> RowCheck:
    """Every position of every call shape ``block_forward`` makes up to ``context`` keys.

    For each key-slot count S = 256, 512, … ≤ key_slots(``context``): B jobs of one session
    whose prefix P = min(S, context) − L puts a chain of L rows (root + L − 1 nodes) inside S,
    in one forward — every (segment, row) position of the attention call and, with B·L ≥ R,
    every position of the per-row calls — against one walk of L one-token steps. One prompt is
    prefilled once and cut back for each S, longest first (a forward writes no KV, so the jobs
    can share the session)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    shape = block_forward.block_shape(model.embed_tokens.weight.device)
    length, count = shape.segment, max(shape.segments, -(-shape.rows // shape.segment))
    last = block_forward.key_slots(context)
    prefixes = [max(1, min(s, context) - length) for s in range(block_forward.KEY_BLOCK, last + 1, block_forward.KEY_BLOCK)]
    session = _session(model, _ids(rng, vocab, prefixes[-1] + 1), length)
    check = NO_ROWS
    for prefix in reversed(prefixes):
        del session.tokens[prefix + 1:]
        session.kv.truncate(prefix)
        chain, parents = _ids(rng, vocab, length - 1), list(range(-1, length - 2))
        want = step_rows(session, chain, parents)
        for result in forward_chains(model, [session.chain_job(chain, parents)] * count):
            check = check.merge(compare_rows(session.logits(result), want))
    return check


@dataclass(slots=True, frozen=True)
class Invariance:
    """How the verify mode was decided: by construction (the row kernels) or by measurement."""

    construction: str  # "row-invariant kernels, <isa>" or "fixed-shape library calls, <R>-row blocks"
    check: RowCheck  # what the start-up probe compared
    measured: bool = False  # True: positions within a block enumerated by position_probe

    def line(self) -> str:
        c = self.check
        what = f"{c.rows} rows compared, {c.differing} differ"
        if self.measured:
            return (f"{self.construction}: every block position and key-slot count checked at start-up "
                    f"({what})")
        return f"tree rows bitwise by construction ({self.construction}); start-up check: {what}"


def check_invariance(model: Decoder, context: int) -> Invariance:
    """The start-up check ``rapid serve`` and ``rapid doctor`` run: the cheap ``probe`` where the
    row kernels give invariance by construction; on fixed-shape library calls, ``probe`` and
    ``position_probe`` up to ``context`` keys (every shape and position a row can take)."""
    if row_forward.enabled(model):
        return Invariance(f"row-invariant kernels, {rowops.info().isa}", probe(model))
    shape = block_forward.block_shape(model.embed_tokens.weight.device)
    return Invariance(f"fixed-shape library calls, {shape.rows}-row blocks",
                      probe(model).merge(position_probe(model, context)), measured=True)
