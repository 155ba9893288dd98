"""The PyTorch target: per-session KV, one batched forward per tree, sample-then-match.

A session holds the committed tokens ``x[0:n]`` and the target KV of ``x[0:n-1]``; the last
committed token is the tree root and is fed with every tree. A tree of N nodes has 1 + N rows

    ids       [root, node_0 … node_{N-1}]
    positions [n-1,  n-1 + depth_j …]

computed in one forward (``rapid.server.chains``: each row attends its session's prefix, then
its ancestors and itself, so every row is bitwise the one-token step of its prefix). Then
``pick`` every row, ``accept`` (``rapid.core.acceptance``), ``commit`` the KV of the root and the
accepted path, and append path tokens + bonus. With ``logprobs`` k >= 0 the session also scores
every emitted token (``rapid.server.scores``: its log-probability and top k, from the very row
that picked it) into ``last_scores``, read with the verdict. An empty tree is one step of plain
autoregressive decoding, which is what ``reference_decode`` (the target alone) runs.

That equality holds by construction on the CPU row kernels (``rapid.server.row_forward``); on
library kernels (``rapid.server.block_forward``: a CUDA target, float64) every call has a fixed
shape and ``rapid.server.invariance.position_probe`` checks the one thing left, a row's position
in its block. A session verifies in one of two modes:

- ``tree``: one forward per tree.
- ``sequential``: the fallback where rows are not shown invariant: walk the tree one
  one-token forward per accepted level. Each forward is exactly a target-alone step, so the
  output is identical by construction; it saves round trips, not target time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rapid.core.acceptance import Verdict, accept, finish, validate_tree
from rapid.core.errors import RapidError
from rapid.core.geometry import ROOT, child_with, node_positions, tree_depths
from rapid.core.sampling import SamplingParams, pick_tokens
from rapid.kvcache import StaticKV
from rapid.modeling import Decoder
from rapid.server.chains import ChainJob, ChainResult, forward_chains, leaf_chains
from rapid.server.chains import commit as chains_commit
from rapid.server.scores import Scores, score_verdict


class BadTreeError(RapidError):
    """The tree a client sent is malformed or exceeds a limit."""


class PromptTooLongError(BadTreeError):
    """The prompt does not fit the session's context."""


VERIFY_MODES = ("tree", "sequential")


class TargetSession:
    """One edge's sequence on the target model."""

    def __init__(self, model: Decoder, prompt: Sequence[int], params: SamplingParams,
                 capacity: int = 4096, max_nodes: int = 256, mode: str = "tree", logprobs: int = -1) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"verify mode {mode!r} is not one of {VERIFY_MODES}")
        if not prompt:
            raise BadTreeError("the prompt is empty")
        if len(prompt) + 1 > capacity:
            raise PromptTooLongError(f"prompt of {len(prompt)} tokens does not fit the context ({capacity})")
        vocab = model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise BadTreeError(f"prompt has token ids outside [0, {vocab})")
        self.model = model
        self.mode = mode
        self.params = params
        self.logprobs = logprobs  # -1: no scores; k >= 0: score emitted tokens with their top k
        self.last_scores = Scores()  # the scores of the last committed verdict (empty when not asked)
        self._decided = Scores()
        self.max_nodes = max_nodes
        self.device = model.embed_tokens.weight.device  # the target may live on a GPU
        self.kv = StaticKV.for_config(model.config, capacity, model.dtype, self.device)
        self.tokens: list[int] = list(prompt)
        self.forwards = 0
        if len(prompt) > 1:  # the prompt's KV but its last token (the first tree's root)
            rows = list(range(len(prompt) - 1))
            job = ChainJob(self.kv, self.tokens[:-1], rows, [rows])
            chains_commit(forward_chains(model, [job], logits=False)[0], self.kv, rows)
            self.forwards += 1

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def chain_job(self, tokens: Sequence[int], parents: Sequence[int]) -> ChainJob:
        """[root] + nodes as chains (``rapid.server.chains``): ids, positions, root-to-leaf paths."""
        n_ctx = len(self.tokens)
        ids = [self.tokens[-1], *tokens]
        pos = [n_ctx - 1, *node_positions(tree_depths(parents), n_ctx - 1)]
        return ChainJob(self.kv, ids, pos, leaf_chains(parents))

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> ChainResult:
        """The tree forward (logits ``[1+N, V]``); changes nothing until ``commit``."""
        result = forward_chains(self.model, [self.chain_job(tokens, parents)])[0]
        self.forwards += 1
        return result

    def check_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> str | None:
        """Why this tree cannot be verified now (malformed, over a limit, context full), or None."""
        why = validate_tree(tokens, parents, self.model.config.vocab_size, self.max_nodes)
        if why is None and self.kv.length + 1 + len(tokens) + 1 > self.kv.capacity:
            why = f"context full: {len(self.tokens)} committed + {len(tokens)} tree nodes exceed {self.kv.capacity}"
        return why

    def decide(self, logits: np.ndarray, pos: Sequence[int], tokens: Sequence[int],
               parents: Sequence[int]) -> Verdict:
        """The acceptance rule on this tree's logits ``[1+N, V]``; changes nothing."""
        picks = pick_tokens(logits, np.asarray(pos) + 1, self.params)
        verdict = accept(tokens, parents, picks.tolist())
        self._decided = score_verdict(logits, verdict, tokens, self.logprobs) if self.logprobs >= 0 else Scores()
        return verdict

    def commit(self, result: ChainResult, verdict: Verdict, tokens: Sequence[int]) -> None:
        """Keep the KV of the root and the accepted path; append path tokens + bonus."""
        chains_commit(result, self.kv, [0, *(1 + j for j in verdict.path)])
        self.last_scores, self._decided = self._decided, Scores()
        self.tokens.extend(tokens[j] for j in verdict.path)
        self.tokens.append(verdict.bonus)

    def logits(self, result: ChainResult) -> np.ndarray:
        return result.logits.float().cpu().numpy()

    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> Verdict:
        """Verify one tree; on success the session has advanced by ``verdict.emitted`` tokens."""
        why = self.check_tree(tokens, parents)
        if why:
            raise BadTreeError(why)
        if self.mode == "sequential" and tokens:
            return self._verify_sequential(tokens, parents)
        result = self.forward_tree(tokens, parents)
        verdict = self.decide(self.logits(result), result.positions, tokens, parents)  # raises: nothing changed
        self.commit(result, verdict, tokens)
        return verdict


    def _verify_sequential(self, tokens: Sequence[int], parents: Sequence[int]) -> Verdict:
        """Walk the tree with one-token forwards (target-alone steps): pick, follow the child
        holding the pick, stop at the first level without one; the last pick is the bonus."""
        path: list[int] = []
        node = ROOT
        scores = Scores()
        while True:
            step = self.verify([], [])  # one target-alone step: appends the target's pick
            scores.extend(self.last_scores)
            child = child_with(tokens, parents, node, step.bonus)
            if child is None:  # the pick already appended is the bonus; the path is committed
                self.last_scores = scores
                return Verdict(tuple(path), step.bonus)
            path.append(child)
            node = child


def reference_decode(model: Decoder, prompt: Sequence[int], max_new: int, params: SamplingParams,
                     stop_ids: Sequence[int] = (), capacity: int = 4096) -> list[int]:
    """Target-only decoding: one token per forward, the same picks (the exactness reference)."""
    return reference_scored(model, prompt, max_new, params, stop_ids, capacity)[0]


def reference_scored(model: Decoder, prompt: Sequence[int], max_new: int, params: SamplingParams,
                     stop_ids: Sequence[int] = (), capacity: int = 4096, logprobs: int = -1) -> tuple[list[int], Scores]:
    """``reference_decode`` that also scores each token (its log-probability and top ``logprobs``)."""
    session = TargetSession(model, prompt, params, capacity=capacity, logprobs=logprobs)
    out: list[int] = []
    scores = Scores()
    while True:
        out.append(session.verify([], []).bonus)
        scores.extend(session.last_scores)
        out, done = finish(out, max_new, stop_ids)
        if done:
            k = max(logprobs, 0)
            return out, Scores(scores.logprobs[:len(out)], scores.top_ids[:k * len(out)],
                               scores.top_logprobs[:k * len(out)])
