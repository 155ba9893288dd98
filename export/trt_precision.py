"""The ops an FP16 TensorRT engine must keep in fp32, and the check that a graph does.

``rapid export --dtype fp16`` writes an fp16 graph with explicit Casts around the numerically
fragile parts, exactly as the fp16 PyTorch ``Decoder`` computes them:

- RMSNorm: ``h = x.float(); h · rsqrt(mean(h²) + eps)`` in fp32, then ``.to(fp16) · weight``
  (``h²`` overflows fp16 once |x| > 256);
- RoPE angles: ``positions.float() · inv_freq``, ``cos``, ``sin`` in fp32, then ``.to(fp16)`` (an
  fp16 angle at position 2048 has an ulp of 2 rad);
- the attention softmax in fp32.

``rapid.export.trt_build`` builds that graph as a *strongly typed* network
(``NetworkDefinitionCreationFlag.STRONGLY_TYPED``): every tensor keeps its ONNX type, so the
islands above stay fp32 and the rest fp16 — the very graph that export parity checked with ONNX
Runtime. (A weakly typed build with ``BuilderFlag.FP16`` may pick fp16 for any layer, Casts
notwithstanding; strongly typed is also the only mode of TensorRT 11.)

Before building, :func:`check_onnx_precision` verifies the graph, so an fp16 graph from elsewhere
whose norms or RoPE run in fp16 is refused rather than built. The rules, over the graph's
element types (``value_info``, or ONNX type inference where it is missing):

1. every float input and output of ``FP32_OPS`` (pow, mean, sqrt, reciprocal, softmax, cos,
   sin, fused norm ops) is fp32;
2. the ``Mul`` consuming a ``Reciprocal`` (RMSNorm's ``h · rsqrt``) is fp32;
3. every float tensor upstream of a ``Cos`` / ``Sin`` input (the RoPE angles) is fp32, up to the
   integer positions.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx
from onnx import TensorProto

from rapid.core.errors import RapidError

FP32_OPS = frozenset({"Pow", "ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Cos", "Sin",
                      "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"})
FLOAT_TYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
               TensorProto.BFLOAT16: "bfloat16", TensorProto.DOUBLE: "float64"}


class PrecisionError(RapidError):
    """An fp16 graph computes a norm, RoPE or softmax in reduced precision."""


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """``{tensor name: TensorProto element type}`` for every tensor of the main graph."""
    def collect(g: onnx.GraphProto) -> dict[str, int]:
        types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
        types.update({i.name: i.data_type for i in g.initializer})
        return types

    types = collect(model.graph)
    if any(o and o not in types for n in model.graph.node for o in n.output):
        types = collect(onnx.shape_inference.infer_shapes(model, strict_mode=False).graph)
    return types


def graph_precision(model: onnx.ModelProto) -> str:
    """``"fp16"`` or ``"fp32"``: the element type of the graph's ``attn_mask`` input."""
    mask = next((i for i in model.graph.input if i.name == "attn_mask"), None)
    if mask is None:
        raise PrecisionError("the graph has no attn_mask input: not a RAPID draft export")
    return {TensorProto.FLOAT16: "fp16", TensorProto.FLOAT: "fp32"}.get(mask.type.tensor_type.elem_type, "other")


def fp16_violations(model: onnx.ModelProto) -> list[str]:
    """One line per tensor that rules 1-3 of the module docstring want fp32 but is not."""
    types, nodes = element_types(model), model.graph.node
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out: list[str] = []

    def want_fp32(node: onnx.NodeProto, names: Iterable[str], why: str) -> None:
        for name in names:
            t = types.get(name)
            if t in FLOAT_TYPES and t != TensorProto.FLOAT:
                out.append(f"{node.name or node.op_type} ({node.op_type}): {why} {name!r} is {FLOAT_TYPES[t]}")

    for n in nodes:
        if n.op_type in FP32_OPS:
            want_fp32(n, [*n.input, *n.output], "tensor")
        if n.op_type == "Reciprocal":
            for m in consumers.get(n.output[0], []):
                if m.op_type == "Mul":
                    want_fp32(m, [*m.input, *m.output], "RMSNorm's x·rsqrt tensor")
    seen: set[str] = set()
    todo = [i for n in nodes if n.op_type in ("Cos", "Sin") for i in n.input]
    while todo:
        name = todo.pop()
        if name in seen or types.get(name) not in FLOAT_TYPES:
            continue  # the integer positions end the walk
        seen.add(name)
        node = producer.get(name)
        if node is not None:
            want_fp32(node, [name], "RoPE angle tensor")
            todo.extend(node.input)
    return out


def check_onnx_precision(onnx_path: str | Path) -> str:
    """The graph's precision (``"fp16"`` / ``"fp32"``); raises :class:`PrecisionError` for an
    fp16 graph breaking the rules, or a graph that is neither."""
    model = onnx.load(str(onnx_path), load_external_data=False)  # types only: no weights needed
    precision = graph_precision(model)
    if precision == "other":
        raise PrecisionError(f"{onnx_path}: attn_mask is neither float16 nor float32")
    bad = fp16_violations(model) if precision == "fp16" else []
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise PrecisionError(f"{onnx_path} is fp16 but computes in reduced precision what an FP16 engine keeps "
                             f"in fp32: {'; '.join(bad[:3])}{more}. Re-export with `rapid export --dtype fp16`")
    return precision
