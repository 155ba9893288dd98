"""The export folder's layout and ``manifest.json``: names every backend agrees on.

An export folder (``DIR``) holds::

    draft.onnx (+ draft.onnx.data when the weights exceed 2 GB)   the graph, see below
    manifest.json                                                 this module's format
    tokenizer files                                               ``tokenizer.save_pretrained``
    draft.engine, timing.cache                                    after ``rapid.export.trt_build``

The graph's I/O (``present`` = the NEW entries only, convention ``"new"``)::

    input_ids        [1, T]                      int64
    position_ids     [1, T]                      int64
    attn_mask        [1, 1, T, P+T]              model dtype, additive (0 = attend, -1e9 = blocked)
    past_key_i       [1, kv_heads, P, head_dim]  model dtype, i = 0 … layers-1
    past_value_i     [1, kv_heads, P, head_dim]
    -> logits        [1, T, vocab]               model dtype
    -> present_key_i [1, kv_heads, T, head_dim]  keys of the T new tokens only
    -> present_value_i

A runtime keeps its own cache and writes ``present_*`` at slots ``[P, P+T)``: the graph never
copies the past to its outputs, so a step returns O(T) KV, not O(P).

This module imports neither torch nor onnxruntime, so the edge runtime can read a manifest.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.errors import RapidError

FORMAT = "rapid-draft-export"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ONNX_FILE = "draft.onnx"
ENGINE_FILE = "draft.engine"
TIMING_CACHE_FILE = "timing.cache"
PRESENT_KV_CONVENTION = "new"  # present_* hold only the T new entries, not past + new
DTYPES = ("fp32", "fp16")


class ManifestError(RapidError):
    """An export folder is missing, incomplete or from an incompatible exporter."""


def input_names(num_layers: int) -> list[str]:
    names = ["input_ids", "position_ids", "attn_mask"]
    for i in range(num_layers):
        names += [f"past_key_{i}", f"past_value_{i}"]
    return names


def output_names(num_layers: int) -> list[str]:
    names = ["logits"]
    for i in range(num_layers):
        names += [f"present_key_{i}", f"present_value_{i}"]
    return names


def io_spec(num_layers: int, kv_heads: int, head_dim: int, vocab: int, dtype: str) -> dict[str, Any]:
    """``{"inputs": [...], "outputs": [...]}`` with name, symbolic shape and element type."""
    el = "float16" if dtype == "fp16" else "float32"
    inputs: list[dict[str, Any]] = [
        {"name": "input_ids", "shape": [1, "T"], "dtype": "int64"},
        {"name": "position_ids", "shape": [1, "T"], "dtype": "int64"},
        {"name": "attn_mask", "shape": [1, 1, "T", "P+T"], "dtype": el},
    ]
    outputs: list[dict[str, Any]] = [{"name": "logits", "shape": [1, "T", vocab], "dtype": el}]
    for i in range(num_layers):
        for kind in ("key", "value"):
            inputs.append({"name": f"past_{kind}_{i}", "shape": [1, kv_heads, "P", head_dim], "dtype": el})
            outputs.append({"name": f"present_{kind}_{i}", "shape": [1, kv_heads, "T", head_dim], "dtype": el})
    return {"inputs": inputs, "outputs": outputs}


def numpy_dtype(manifest: dict[str, Any]):
    """The numpy dtype of the graph's float tensors (mask, KV, logits)."""
    return np.float16 if manifest.get("dtype") == "fp16" else np.float32


def is_export_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST_FILE).is_file()


def load_manifest(export_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and sanity-check ``DIR/manifest.json``."""
    folder = Path(export_dir).expanduser()
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise ManifestError(f"export folder {folder} does not exist (make one with "
                            f"`rapid export --out {shlex.quote(str(folder))}`)")
    if not path.is_file():
        raise ManifestError(f"{folder} has no {MANIFEST_FILE}: it is not a RAPID export folder")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a JSON object: it is not a RAPID manifest")
    if data.get("format") != FORMAT:
        raise ManifestError(f"{path} is not a {FORMAT} manifest (format={data.get('format')!r})")
    if int(data.get("format_version", -1)) > FORMAT_VERSION:
        raise ManifestError(f"{path} has format_version {data.get('format_version')}, "
                            f"this RAPID reads up to {FORMAT_VERSION}; upgrade RAPID")
    if data.get("present_kv") != PRESENT_KV_CONVENTION:
        raise ManifestError(f"{path}: present-KV convention {data.get('present_kv')!r} is not "
                            f"{PRESENT_KV_CONVENTION!r}")
    for key in ("model", "dtype", "max_context", "max_tree", "io", "architecture", "files"):
        if key not in data:
            raise ManifestError(f"{path} lacks the field {key!r}")
    return data


def write_manifest(export_dir: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write ``DIR/manifest.json`` atomically (a crash never leaves half a manifest)."""
    folder = Path(export_dir)
    path = folder / MANIFEST_FILE
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a manifest is meant to be read by anyone
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
