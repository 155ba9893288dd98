"""ONNX Runtime (CPU) vs the PyTorch ``Decoder``: the check every export runs before it counts.

Three chained steps, the shapes a draft really runs:

====================  ====  ====  =============================================
case                  T     P     mask
====================  ====  ====  =============================================
``prefill``           16    0     causal
``decode``            1     16    sees everything (dynamic T = 1, although the
                                  export example used T ≥ 2)
``tree``              6     17    non-causal: each node sees the prefix, its
                                  ancestors and itself (two branches)
====================  ====  ====  =============================================

Each side keeps its *own* cache (PyTorch a ``StaticKV``, ONNX the concatenation of the presents it
returned), exactly like an engine, so a wrong present-KV output shows up in the next step.

Thresholds on the max absolute logit difference:

- fp32: ``1e-4`` absolute (ORT and PyTorch differ by GEMM summation order only; measured
  ~7e-6 on the tiny models and 3.1e-5…5.2e-5 on Qwen2.5-Coder-0.5B, logits up to ~20).
- fp16: the fp16 graph is compared with the fp32 PyTorch model (what the draft *should*
  compute), with a bound of ``2e-2 × max(1, max |logit|)``. fp16 keeps 11 significant bits
  (unit round-off 4.9e-4); rounding of the weights, the KV cache and every activation
  accumulates over the layers to a few 1e-3 of the logit scale (measured 2.5e-3 on the tiny
  model), so 2 % leaves margin while still catching real breakage (wrong KV wiring, overflow,
  a lost mask), which moves logits by O(scale). A draft's numerics only change how often the
  target accepts a proposal, never the output, so top-1 agreement is reported alongside.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.errors import RapidError
from rapid.core.geometry import ancestor_mask, tree_depths
from rapid.core.manifest import input_names, output_names
from rapid.core.optional import import_optional

log = logging.getLogger("rapid.export.parity")

THRESHOLDS = {"fp32": 1e-4, "fp16": 2e-2}
THRESHOLD_KIND = {"fp32": "absolute", "fp16": "relative to max(1, max|logit|)"}
PREFILL_T = 16
TREE_PARENTS = (-1, 0, 0, 1, 2, 3)  # node 0 has two children (1, 2); two branches of depth 3


class ParityError(RapidError):
    """The exported graph's logits differ from the PyTorch model's beyond the threshold."""


def tree_allowed(parents: tuple[int, ...] | list[int], prefix: int) -> tuple[np.ndarray, np.ndarray]:
    """(allowed [T, prefix+T] bool, depth [T] from 0) for a whole tree fed after ``prefix`` slots."""
    t = len(parents)
    allowed = ancestor_mask(parents, range(t), [prefix + j for j in range(t)], prefix)
    return allowed, np.asarray(tree_depths(parents), dtype=np.int64) - 1


def parity_steps(vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """The three chained steps: name, tokens [T], positions [T], allowed [T, P+T], P."""
    rng = np.random.default_rng(seed)
    steps = []
    p = 0
    t = PREFILL_T
    allowed = np.ones((t, t), dtype=bool) & np.tril(np.ones((t, t), dtype=bool))
    steps.append(dict(name="prefill", tokens=rng.integers(0, vocab, t), positions=np.arange(t), allowed=allowed, P=p))
    p += t
    steps.append(dict(name="decode", tokens=rng.integers(0, vocab, 1), positions=np.array([p]),
                      allowed=np.ones((1, p + 1), dtype=bool), P=p))
    p += 1
    allowed, depth = tree_allowed(TREE_PARENTS, p)
    steps.append(dict(name="tree", tokens=rng.integers(0, vocab, len(TREE_PARENTS)), positions=p + depth,
                      allowed=allowed, P=p))
    return steps


def ort_session(onnx_path: Path, threads: int | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


def _check_presents(outs: dict, kv: Any, past: dict, c: Any, start: int, t: int) -> float:
    """max |ΔKV| of the ``t`` new entries against the reference cache (what the next step attends
    to); appends them to ``past`` for the next ONNX step."""
    kv_diff = 0.0
    for i in range(c.num_layers):
        for kind, buf in (("key", kv.k), ("value", kv.v)):
            new = outs[f"present_{kind}_{i}"]
            if new.shape != (1, c.num_kv_heads, t, c.head_dim):
                raise ParityError(f"present_{kind}_{i} has shape {list(new.shape)}, expected "
                                  f"[1, {c.num_kv_heads}, {t}, {c.head_dim}] (present = new entries only)")
            want = buf[i, :, start:start + t].numpy()
            kv_diff = max(kv_diff, float(np.abs(new[0].astype(np.float32) - want).max()))
            name = f"past_{kind}_{i}"
            past[name] = np.concatenate([past[name], new], axis=2)
    return kv_diff


def run_parity(onnx_path: str | Path, reference: Any, dtype: str = "fp32", *, threshold: float | None = None,
               seed: int = 0, raise_on_fail: bool = True, session: Any = None) -> dict[str, Any]:
    """Run the three steps on ORT CPU and on ``reference`` (a float32 ``rapid.modeling.Decoder``).

    Returns ``{"cases": {name: {T, P, max_abs_diff, max_abs_logit, bound, top1_agree,
    kv_max_abs_diff}}, "max_abs_diff", "threshold", "threshold_kind", "ok", ...}``; raises
    :class:`ParityError` when a case exceeds its bound (unless ``raise_on_fail`` is false).
    """
    import torch

    StaticKV = import_optional("rapid.kvcache", "export").StaticKV
    additive_mask = import_optional("rapid.modeling", "export").additive_mask
    if dtype not in THRESHOLDS:
        raise ValueError(f"dtype must be one of {sorted(THRESHOLDS)}, got {dtype!r}")
    thr = THRESHOLDS[dtype] if threshold is None else float(threshold)
    c = reference.config
    np_dt = np.float16 if dtype == "fp16" else np.float32
    t0 = time.perf_counter()
    sess = session if session is not None else ort_session(Path(onnx_path))
    in_names, out_names = input_names(c.num_layers), output_names(c.num_layers)
    past = {n: np.zeros((1, c.num_kv_heads, 0, c.head_dim), np_dt) for n in in_names[3:]}
    steps = parity_steps(c.vocab_size, seed)
    kv = StaticKV.for_config(c, sum(len(s["tokens"]) for s in steps), torch.float32)
    cases: dict[str, Any] = {}
    ok: bool = True
    for s in steps:
        t = len(s["tokens"])
        ids = np.asarray(s["tokens"], np.int64)[None]
        pos = np.asarray(s["positions"], np.int64)[None]
        allowed = s["allowed"]
        kv.begin(t)
        with torch.inference_mode():
            ref = reference(torch.from_numpy(ids), torch.from_numpy(pos),
                            additive_mask(torch.from_numpy(allowed), torch.float32), kv)[0].float().numpy()
        kv.commit(t)
        ort_mask = additive_mask(torch.from_numpy(allowed), torch.float16 if dtype == "fp16" else torch.float32)
        feed = {"input_ids": ids, "position_ids": pos, "attn_mask": ort_mask.numpy(), **past}
        outs = dict(zip(out_names, sess.run(out_names, feed), strict=True))
        got = outs["logits"][0].astype(np.float32)
        diff = float(np.abs(got - ref).max())
        scale = float(np.abs(ref).max())
        bound = thr if dtype == "fp32" else thr * max(1.0, scale)
        kv_diff = _check_presents(outs, kv, past, c, s["P"], t)
        case = {"T": t, "P": s["P"], "max_abs_diff": diff, "max_abs_logit": scale, "bound": bound,
                "top1_agree": float(np.mean(got.argmax(-1) == ref.argmax(-1))), "kv_max_abs_diff": kv_diff}
        cases[s["name"]] = case
        log.info("parity %-7s T=%-2d P=%-2d max|Δlogit|=%.3g (bound %.3g) top1=%.2f max|ΔKV|=%.3g",
                 s["name"], t, s["P"], diff, bound, case["top1_agree"], kv_diff)
        ok = ok and diff <= bound  # a NaN fails too
    result = {"reference": "rapid.modeling.Decoder float32 (PyTorch, CPU)",
              "runtime": "onnxruntime CPUExecutionProvider, ORT_ENABLE_ALL", "dtype": dtype, "threshold": thr,
              "threshold_kind": THRESHOLD_KIND[dtype], "cases": cases,
              "max_abs_diff": max(cc["max_abs_diff"] for cc in cases.values()), "ok": ok,
              "seconds": round(time.perf_counter() - t0, 3)}
    if not ok and raise_on_fail:
        bad = {k: f"{v['max_abs_diff']:.3g} > {v['bound']:.3g}" for k, v in cases.items()
               if not v["max_abs_diff"] <= v["bound"]}
        raise ParityError(f"ONNX export {onnx_path} fails parity against PyTorch ({dtype}): {bad}; "
                          "the graph is left in place for inspection, no manifest was written")
    return result
