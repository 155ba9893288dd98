"""The prompt-lookup chains of the simulator's replay, as the runtime's drafter sees them: what a
cost-aware controller is told before each decision (``Drafter.lookup_outlook``) and how the
request's ``LookupStats`` learn from a verdict. Pure: the replayed reach in, plain data out."""

from __future__ import annotations

from rapid.runtime.lookup import LookupStats


def chain_outlook(stats: LookupStats, reach: int, min_p: float) -> tuple[list[float], int]:
    """P(the chain carries the accepted path to level k) = ``p^k`` for k = 1..``reach`` (each
    lookup token scores log p, as ``TokenTree.add_chain``), none below ``min_p`` but the first
    (``TokenTree.prune``'s floor), and the node count."""
    p = stats.p
    mass = [p ** k for k in range(1, reach + 1) if k == 1 or p ** k >= min_p]
    return mass, len(mass)


def observe_chain(stats: LookupStats, reach: int, accepted: int) -> None:
    """``LookupStats.observe`` for a verdict that accepted ``accepted`` levels of a tree carrying
    a ``reach``-level chain: it matched ``min(reach, accepted)`` tokens, and missed the next where
    the verdict stopped inside it."""
    ell = min(reach, accepted)
    stats.observe([list(range(reach))] if reach else [], list(range(ell)) + [-1] * (accepted + 1 - ell))
