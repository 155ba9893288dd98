"""The layers, held by a static scan of every import (top-level and inside functions).

    runtime ↛ server      server ↛ runtime      engines ↛ runtime, server      export ↛ engines
    the core (rapid/ torch-free modules) ↛ any layer, any non-core rapid module, torch
    nothing ↛ the CLI (rapid.cli)

A violation names the file, the line and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"export": "rapid.export", "engines": "rapid.engines", "runtime": "rapid.runtime",
           "server": "rapid.server", "bench": "rapid.bench"}
# the torch-free core both sides share (rapid/<name>.py)
CORE = {"rapid", "rapid.acceptance", "rapid.auth", "rapid.errors", "rapid.geometry", "rapid.logsafe", "rapid.manifest",
        "rapid.procs", "rapid.sampling", "rapid.trt_support", "rapid.vocab", "rapid.wire"}
LAYERS = tuple(FOLDERS.values())
FORBIDDEN = {
    "rapid.runtime": ("rapid.server",),
    "rapid.server": ("rapid.runtime",),
    "rapid.engines": ("rapid.runtime", "rapid.server"),
    "rapid.export": ("rapid.engines", "rapid.runtime", "rapid.server"),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in FOLDERS:
        parts = FOLDERS[parts[0]].split(".") + parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path, text: str) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file, at any depth."""
    tree = ast.parse(text, filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from rapid import models` imports rapid.models
            out += [(node.lineno, f"{base}.{a.name}" if base in ("rapid", *LAYERS) else base) for a in node.names]
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def forbidden(src: str, target: str) -> str | None:
    """Why ``src`` may not import ``target``, or None."""
    if src != "rapid.cli" and under(target, "rapid.cli"):
        return "nothing imports the CLI"
    if src in CORE:
        if under(target, "torch"):
            return "the core is torch-free"
        if under(target, "rapid") and target not in CORE:
            return "the core imports only the core"
    for layer, banned in FORBIDDEN.items():
        if under(src, layer):
            for b in banned:
                if under(target, b):
                    return f"{layer} ↛ {b}"
    return None


def sources() -> list[Path]:
    files = sorted((REPO / "rapid").glob("*.py"))
    for folder in FOLDERS:
        files += sorted((REPO / folder).rglob("*.py"))
    return files


def check_file(path: Path, text: str) -> list[str]:
    src = module_name(path)
    out = []
    for line, target in imports(path, text):
        why = forbidden(src, target)
        if why:
            out.append(f"{path.relative_to(REPO)}:{line}: imports {target} ({why})")
    return out


def violations() -> list[str]:
    return [v for path in sources() for v in check_file(path, path.read_text())]


def test_the_layers_hold():
    found = violations()
    assert not found, "layer violations:\n" + "\n".join(found)


def test_every_core_module_exists():
    assert {m for m in CORE if not (REPO / (m.replace(".", "/") + ".py")).is_file()} == {"rapid"}


@pytest.mark.parametrize("src,target,why", [
    ("rapid.runtime.coordinator", "rapid.server.target", "rapid.runtime ↛ rapid.server"),
    ("rapid.server.app", "rapid.runtime.tree", "rapid.server ↛ rapid.runtime"),
    ("rapid.engines.ort_engine", "rapid.runtime.tree", "rapid.engines ↛ rapid.runtime"),
    ("rapid.export.trt_build", "rapid.engines.trt_engine", "rapid.export ↛ rapid.engines"),
    ("rapid.runtime.daemon", "rapid.cli", "nothing imports the CLI"),
    ("rapid.geometry", "torch", "the core is torch-free"),
    ("rapid.wire", "rapid.modeling", "the core imports only the core"),
])
def test_the_rules_catch(src, target, why):
    assert forbidden(src, target) == why


def test_a_violation_names_file_line_and_import():
    text = "import numpy\n\n\ndef f():\n    from rapid.server.target import TargetSession\n"
    assert check_file(REPO / "runtime" / "probe.py", text) == [
        "runtime/probe.py:5: imports rapid.server.target (rapid.runtime ↛ rapid.server)"]
    assert check_file(REPO / "rapid" / "geometry.py", "from . import cli\nimport torch.nn\n") == [
        "rapid/geometry.py:1: imports rapid.cli (nothing imports the CLI)",
        "rapid/geometry.py:2: imports torch.nn (the core is torch-free)"]
