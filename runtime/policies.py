"""Every drafting policy as data: which mechanisms a round uses. All are lossless — they only
change what is drafted and when, never how the cloud accepts.

| name       | depth            | proactive branch            | interrupted on feedback |
|------------|------------------|-----------------------------|-------------------------|
| fixed      | fixed            | no                          | –                       |
| npdg       | fixed            | yes, to the planned depth   | no  (SpecEdge)          |
| ipdg       | fixed            | yes                         | yes                     |
| caac       | CAAC             | no                          | –                       |
| rapid      | CAAC             | yes                         | yes                     |
| rapid-cost | tokens/s, η gate | yes                         | yes (the default)       |
| edgellm    | confidence cut   | yes (provisional, chain)    | no  (EdgeLLM-style)     |
| ar         | 0 (no draft)     | no                          | –   (cloud-only)        |

``rapid`` is the paper's controller; ``rapid-cost`` keeps its gate and IPDG but picks the depth by
expected accepted tokens per second of wall time (``rapid.runtime.cost_caac``), and is the default
(``rapid.runtime.edge_config``): the faster of the two in the slow-edge bench (docs/results.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Policy:
    name: str
    drafting: bool = True
    adaptive_depth: bool = False  # CAAC chooses the depth
    proactive: bool = False  # expand D_{i+1} while D_i is verified
    interruptible: bool = False  # stop the branch at the first step boundary after feedback
    confidence_floor: float | None = None  # EdgeLLM fallback: stop when the best node's q < floor
    chain_branch: bool = False  # proactive branch is a single chain (width 1)
    cost_aware: bool = False  # the depth maximises expected tokens per second (runtime.cost_caac)


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("fixed"),
        Policy("npdg", proactive=True),
        Policy("ipdg", proactive=True, interruptible=True),
        Policy("caac", adaptive_depth=True),
        Policy("rapid", adaptive_depth=True, proactive=True, interruptible=True),
        Policy("rapid-cost", adaptive_depth=True, proactive=True, interruptible=True, cost_aware=True),
        Policy("edgellm", proactive=True, confidence_floor=0.35, chain_branch=True),
        Policy("ar", drafting=False),
    )
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
