"""Export a draft model to ONNX with explicit KV inputs/outputs, then prove it matches PyTorch.

``export_onnx(model, out_dir)`` loads the model (an HF id, a local folder, a ``.gguf`` or
``default-draft``) into ``rapid.modeling.Decoder`` — the very forward the PyTorch backend and the
cloud target run — wraps it in :class:`OnnxDecoder` with flat inputs and exports it with
``torch.onnx.export(..., dynamo=True)`` and named dynamic dims::

    input_ids [1, T] int64, position_ids [1, T] int64, attn_mask [1, 1, T, P+T] float,
    past_key_0, past_value_0, … [1, kv_heads, P, head_dim]
    -> logits [1, T, V], present_key_0, present_value_0, … [1, kv_heads, T, head_dim]

**Present-KV convention: ``present_*`` are the T NEW entries only** (not past + new). The
runtime owns its cache and writes them at ``[P, P+T)``; returning the whole cache would copy
O(P) per layer per step for nothing. Recorded as ``"present_kv": "new"`` in the manifest.

Recipe (measured here, torch 2.13 / onnxscript 0.7): the traced example uses T = 3, P = 5 (a
size-1 example would be specialised to a constant), the mask's last axis has its own ``Dim``
(not P+T: it stays a free symbol), and the ``*past`` varargs take one nested tuple in
``dynamic_shapes``. ORT runs T = 1 and P = 0 fine (checked by every parity run).

After the export :func:`rapid.export.parity.run_parity` ALWAYS runs (prefill, decode, tree)
and a failure raises :class:`~rapid.export.parity.ParityError` without writing a manifest.

fp16: the fp16 ``Decoder`` is exported as an fp16 graph (mask, KV and logits fp16; RMSNorm and
softmax accumulate in fp32 inside). ORT's CPU EP runs it (slowly), so parity compares that graph
against the fp32 PyTorch model with the looser fp16 bound documented in ``parity.py``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import platform
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rapid.core.errors import RapidError
from rapid.core.manifest import (
    ENGINE_FILE,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    ONNX_FILE,
    PRESENT_KV_CONVENTION,
    input_names,
    io_spec,
    output_names,
    write_manifest,
)
from rapid.core.optional import import_optional
from rapid.export.parity import run_parity
from rapid.models import load_hf_model, load_tokenizer, resolve_model
from rapid.wheels import sha256_file

log = logging.getLogger("rapid.export")

EXTERNAL_DATA_LIMIT = 2 * 1024**3 - 64 * 1024**2  # protobuf's 2 GiB, less room for the graph
MIN_CONTEXT_MARGIN = 16  # max_context must leave at least this many slots beside a full tree
EXAMPLE_T, EXAMPLE_P = 3, 5
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
STAGES = ("check", "load", "export", "save", "tokenizer", "hash", "parity", "manifest")


class ExportError(RapidError):
    """The export cannot run as asked (bad arguments, unwritable folder, exporter failure)."""


# ------------------------------------------------------------------------------ the wrapper --

class ConcatKV:
    """``KVStore`` for tracing: the full keys are ``cat(past, new)``; the new ones are kept as
    the presents (convention "new")."""

    def __init__(self, past: Sequence[Any]) -> None:
        self.past = past  # past_key_0, past_value_0, past_key_1, …
        self.presents: list[Any] = []

    def attend_kv(self, layer: int, k_new, v_new):
        import torch

        self.presents += [k_new, v_new]
        return (torch.cat([self.past[2 * layer], k_new], dim=2),
                torch.cat([self.past[2 * layer + 1], v_new], dim=2))


def _onnx_decoder_class():
    from torch import nn

    class OnnxDecoder(nn.Module):
        """Flat-input view of a ``Decoder``: ``(input_ids, position_ids, attn_mask, *past)`` →
        ``(logits, present_key_0, present_value_0, …)``."""

        def __init__(self, decoder) -> None:
            super().__init__()
            self.decoder = decoder

        def forward(self, input_ids, position_ids, attn_mask, *past):
            kv = ConcatKV(past)
            logits = self.decoder(input_ids, position_ids, attn_mask, kv)
            return (logits, *kv.presents)

    return OnnxDecoder


def wrap_decoder(decoder):
    """The ``nn.Module`` that is exported (see :class:`ConcatKV`)."""
    return _onnx_decoder_class()(decoder).eval()


# ------------------------------------------------------------------------------- helpers --

class _Stages:
    """Per-stage wall times, logged, with a tqdm bar over the stages; the first, ``check``, has run
    (``checked_s``) before the bar is drawn, so a refused input prints nothing but its error."""

    def __init__(self, progress: bool, checked_s: float) -> None:
        from tqdm.auto import tqdm

        self.times: dict[str, float] = {STAGES[0]: round(checked_s, 3)}
        log.info("export stage %-9s %.2f s", STAGES[0], checked_s)
        self.bar = tqdm(total=len(STAGES), initial=1, desc="onnx export", unit="stage", disable=not progress,
                        leave=False)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.times[name] = round(dt, 3)
            log.info("export stage %-9s %.2f s", name, dt)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _check_writable(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".rapid-write-test-"):
            pass
    except OSError as e:
        raise ExportError(f"output folder {out_dir} is not writable: {e.strerror or e}") from e


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "transformers"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def _weights_info(resolved: str, progress: bool) -> dict[str, Any]:
    """sha256 of the local weight files (none for a hub id) and the folder's provenance file."""
    folder = Path(resolved)
    if not folder.is_dir():
        return {"local": False, "weights": [], "note": "hub id: weights are in the Hugging Face cache"}
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    weights = [{"file": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p, progress=progress)}
               for p in files]
    info: dict[str, Any] = {"local": True, "weights": weights}
    src = folder / "rapid-source.json"
    if src.is_file():
        with contextlib.suppress(OSError, ValueError):
            info["provenance"] = json.loads(src.read_text())
    return info


def _param_bytes(module) -> int:
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def check_arguments(decoder_config, dtype: str, max_context: int, max_tree: int) -> None:
    """Raise :class:`ExportError` for arguments the export or a backend could not honour."""
    if dtype not in ("fp32", "fp16"):
        raise ExportError(f"dtype must be 'fp32' or 'fp16', got {dtype!r}")
    if max_tree < 1:
        raise ExportError(f"--max-tree must be at least 1, got {max_tree}")
    if max_context < max_tree + MIN_CONTEXT_MARGIN:
        raise ExportError(
            f"--max-context {max_context} is too small: it must hold a full tree step plus a prompt, "
            f"i.e. at least max_tree + {MIN_CONTEXT_MARGIN} = {max_tree + MIN_CONTEXT_MARGIN}")
    if max_context > decoder_config.max_position:
        raise ExportError(
            f"--max-context {max_context} exceeds the model's max_position_embeddings "
            f"{decoder_config.max_position}")


# -------------------------------------------------------------------------------- export --

def export_onnx(model: str | Path, out_dir: str | Path, dtype: str = "fp32", max_context: int = 2048,
                max_tree: int = 64, progress: bool = True, *, opset: int | None = None,
                parity_threshold: float | None = None) -> dict[str, Any]:
    """Export ``model`` to ``out_dir/draft.onnx``, check parity, write the manifest; return it.

    Raises :class:`ExportError` / :class:`rapid.models.ModelSourceError` /
    :class:`rapid.modeling.UnsupportedModelError` (all ``RapidError``) for bad inputs and
    :class:`rapid.export.parity.ParityError` when ORT disagrees with PyTorch.
    """
    out = Path(out_dir).expanduser()
    t_start = time.perf_counter()
    # bad input fails here, its one-line error before any progress line (no bar, no stage log yet)
    resolved = _check(str(model), out, dtype, int(max_context), int(max_tree))
    stages = _Stages(progress, checked_s=time.perf_counter() - t_start)
    try:
        return _export(str(model), resolved, out, dtype, int(max_context), int(max_tree), progress, opset,
                       parity_threshold, stages, t_start)
    finally:
        stages.close()


def _export(spec: str, resolved: str, out: Path, dtype: str, max_context: int, max_tree: int, progress: bool,
            opset: int | None, parity_threshold: float | None, stage: _Stages, t_start: float) -> dict[str, Any]:
    with stage("load"):
        reference, exported = _load(spec, dtype)
        weight_bytes = _param_bytes(exported)
        external = weight_bytes > EXTERNAL_DATA_LIMIT
    c = reference.config
    onnx_path = out / ONNX_FILE
    data_name = ONNX_FILE + ".data"
    with stage("export"):
        program = _run_exporter(exported, c, max_context, opset)
    with stage("save"):
        for stale in (onnx_path, out / data_name):
            stale.unlink(missing_ok=True)
        try:
            program.save(str(onnx_path), external_data=external)
        except OSError as e:
            raise ExportError(f"cannot write {onnx_path}: {e}") from e
        del program
        graph_opset = _check_graph(onnx_path, c.num_layers)
    with stage("tokenizer"):
        tokenizer_files = _copy_tokenizer(spec, out)
    with stage("hash"):
        source = {"spec": spec, "resolved": resolved, **_weights_info(resolved, progress)}
    with stage("parity"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parity = run_parity(onnx_path, reference, dtype, threshold=parity_threshold)
    with stage("manifest"):
        manifest = _manifest(c, source, dtype, max_context, max_tree)
        manifest["files"] = {"onnx": ONNX_FILE, "onnx_data": data_name if external else None,
                             "tokenizer": tokenizer_files}
        manifest["weights_bytes"] = weight_bytes
        manifest["exporter"] = {"name": "torch.onnx.export(dynamo=True)", "opset": graph_opset,
                                "example_T": EXAMPLE_T, "example_P": EXAMPLE_P, "versions": _versions()}
        manifest["parity"] = parity
    manifest["timings_s"] = dict(stage.times, total=round(time.perf_counter() - t_start, 3))
    write_manifest(out, manifest)
    log.info("exported %s -> %s in %.1f s (parity max |Δlogit| %.3g)", spec, onnx_path,
             manifest["timings_s"]["total"], parity["max_abs_diff"])
    return manifest


def _check(spec: str, out: Path, dtype: str, max_context: int, max_tree: int) -> str:
    """The resolved model path, after every check that needs no weights."""
    from transformers import AutoConfig

    if dtype not in ("fp32", "fp16"):
        raise ExportError(f"dtype must be 'fp32' or 'fp16', got {dtype!r}")
    resolved = resolve_model(spec)  # ModelSourceError for a bad path
    try:
        hf_cfg = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"cannot read the model config of {spec!r} ({resolved}): {e}") from e
    dcfg = import_optional("rapid.modeling", "export").DecoderConfig.from_hf(hf_cfg)  # UnsupportedModelError
    check_arguments(dcfg, dtype, max_context, max_tree)
    _check_writable(out)
    # A failed export must not leave an older manifest/engine describing the new graph.
    for name in (MANIFEST_FILE, ENGINE_FILE):
        (out / name).unlink(missing_ok=True)
    return resolved


def _load(spec: str, dtype: str):
    """(the fp32 reference Decoder, the Decoder to export: the same one, or its fp16 copy)."""
    import torch

    modeling = import_optional("rapid.modeling", "export")
    try:
        hf = load_hf_model(spec, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot load the weights of {spec!r}: {e}") from e
    reference = modeling.Decoder.from_hf(hf)  # fp32, shares the HF tensors
    return reference, reference if dtype == "fp32" else modeling.Decoder.from_hf(hf, dtype=torch.float16)


def _copy_tokenizer(spec: str, out: Path) -> list[str]:
    try:
        load_tokenizer(spec).save_pretrained(out)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot copy the tokenizer of {spec!r}: {e}") from e
    return sorted(p.name for p in out.iterdir() if p.name.startswith(
        ("tokenizer", "special_tokens", "vocab", "merges", "chat_template", "added_tokens")))


def _manifest(c, source: dict, dtype: str, max_context: int, max_tree: int) -> dict[str, Any]:
    """The manifest's fields fixed by the model and the export's arguments."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": source,
        "architecture": {
            "model_type": c.model_type, "layers": c.num_layers, "heads": c.num_heads,
            "kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden": c.hidden_size,
            "vocab": c.vocab_size, "max_position": c.max_position, "rope_theta": c.rope_theta,
            "tie_embeddings": c.tie_embeddings,
        },
        "dtype": dtype,
        "max_context": max_context,
        "max_tree": max_tree,
        "eos_token_ids": list(c.eos_token_ids),
        "present_kv": PRESENT_KV_CONVENTION,
        "present_kv_doc": "present_key_i/present_value_i hold only the T new entries [1, kv_heads, T, "
                          "head_dim]; the runtime writes them into its own cache at slots [P, P+T)",
        "mask": {"kind": "additive", "attend": 0.0, "blocked": -1e9, "shape": [1, 1, "T", "P+T"]},
        "io": io_spec(c.num_layers, c.num_kv_heads, c.head_dim, c.vocab_size, dtype),
    }


def _run_exporter(decoder, c, max_context: int, opset: int | None):
    import torch

    dt = decoder.dtype
    t, p = EXAMPLE_T, EXAMPLE_P
    ids = torch.zeros((1, t), dtype=torch.int64)
    pos = torch.arange(p, p + t, dtype=torch.int64)[None]
    mask = torch.zeros((1, 1, t, p + t), dtype=dt)
    past = tuple(torch.zeros((1, c.num_kv_heads, p, c.head_dim), dtype=dt) for _ in range(2 * c.num_layers))
    dim_t = torch.export.Dim("T", min=1, max=max_context)
    dim_p = torch.export.Dim("P", min=0, max=max_context)
    dim_s = torch.export.Dim("S", min=1, max=2 * max_context)
    dynamic_shapes = {
        "input_ids": {1: dim_t},
        "position_ids": {1: dim_t},
        "attn_mask": {2: dim_t, 3: dim_s},
        "past": tuple({2: dim_p} for _ in past),
    }
    kwargs: dict[str, Any] = {}
    if opset is not None:
        kwargs["opset_version"] = opset
    quiet = {name: logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")}
    levels = {name: lg.level for name, lg in quiet.items()}
    for lg in quiet.values():
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            return torch.onnx.export(
                wrap_decoder(decoder), (ids, pos, mask, *past), dynamo=True, dynamic_shapes=dynamic_shapes,
                input_names=input_names(c.num_layers), output_names=output_names(c.num_layers),
                external_data=True, optimize=True, verbose=False, **kwargs)
    except Exception as e:  # the exporter raises many types; all mean "this graph did not export"
        raise ExportError(f"torch.onnx.export failed: {type(e).__name__}: {e}") from e
    finally:
        for name, lg in quiet.items():
            lg.setLevel(levels[name])


def _check_graph(onnx_path: Path, layers: int) -> int:
    """Check the saved graph's I/O names; return its default-domain opset."""
    import onnx

    m = onnx.load(str(onnx_path), load_external_data=False)
    got_in = [i.name for i in m.graph.input]
    got_out = [o.name for o in m.graph.output]
    if got_in != input_names(layers) or got_out != output_names(layers):
        raise ExportError(f"exported graph has unexpected I/O: inputs {got_in}, outputs {got_out}")
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), -1)


# ----------------------------------------------------------------------------------- CLI --
