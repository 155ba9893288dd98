"""The layers are import-linter contracts in pyproject.toml; this runs them (scripts/lint_imports.py).

    rapid.cli > bench | demo | doctor > runtime | server > engines | export
              > modeling | kvcache | tiny > models > rapid.core (torch-free)

The graph is checked for content too, so a layout change that hid a card folder from the linter
(an empty graph keeps every contract) fails here instead of passing silently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from grimp.application.config import settings
from importlinter.api import read_configuration
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import lint_imports  # noqa: E402  (scripts/ is not a package)

ROOTS = ("rapid", "rapid.export", "rapid.engines", "rapid.runtime", "rapid.server", "rapid.bench")
FOLDERS = {"export": "rapid.export", "engines": "rapid.engines", "runtime": "rapid.runtime",
           "server": "rapid.server", "bench": "rapid.bench", "rapid": "rapid"}


def sources() -> dict[str, Path]:
    """{module name: file} for every package module."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(REPO / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def optional_imports() -> list[tuple[str, str]]:
    """(importer, imported) for every ``import_optional("…")`` call: edges grimp cannot see."""
    return [(name, node.args[0].value) for name, path in sources().items()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_optional"
            and node.args and isinstance(node.args[0], ast.Constant)]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    saved = settings.copy()
    settings.configure(PACKAGE_FINDER=lint_imports.CardFolderFinder())
    try:
        g = grimp.build_graph(*ROOTS, include_external_packages=True, cache_dir=None)
    finally:
        settings.configure(**saved._config)
    for importer, imported in optional_imports():
        g.add_import(importer=importer, imported=imported, line_number=1, line_contents="import_optional")
    return g


def test_every_contract_is_kept_with_the_optional_imports_too(graph):
    assert len(optional_imports()) >= 5
    assert all(check(graph).values()), check(graph)


def test_every_contract_is_kept():
    run = subprocess.run([sys.executable, "scripts/lint_imports.py"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 2 kept, 0 broken." in run.stdout, run.stdout


def test_the_graph_sees_every_card_folder(graph):
    for folder in ("export", "engines", "runtime", "server", "bench"):
        on_disk = {p.stem for p in (REPO / folder).glob("*.py") if p.stem != "__init__"}
        in_graph = {m.rpartition(".")[2] for m in graph.modules if m.startswith(f"rapid.{folder}.")}
        assert on_disk <= in_graph, f"{folder}/: the linter misses {sorted(on_disk - in_graph)}"


def test_the_graph_holds_the_known_edges(graph):
    assert graph.direct_import_exists(importer="rapid.runtime.coordinator", imported="rapid.core.wire")
    # rapid serve needs torch: the CLI loads the server through import_optional
    assert graph.direct_import_exists(importer="rapid.cli", imported="rapid.server.main")


def test_the_project_imports_its_own_modules_at_the_top():
    """Inside a function only third-party optional packages are imported (torch, onnxruntime, …);
    a project module that needs one is loaded with rapid.core.optional.import_optional."""
    found = []
    for path in sources().values():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if (isinstance(node, ast.ImportFrom) and node.level) or any(m.split(".")[0] == "rapid" for m in mods):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} ({fn.name})")
    assert not found, "imports of the project inside functions:\n" + "\n".join(sorted(set(found)))


def check(graph: grimp.ImportGraph) -> dict[str, bool]:
    """{contract name: kept} for pyproject's contracts on ``graph``."""
    config = read_configuration(str(REPO / "pyproject.toml"))
    out = {}
    for options in config["contracts_options"]:
        kind = {"layers": LayersContract, "forbidden": ForbiddenContract}[options["type"]]
        contract = kind(name=options["name"], session_options=config["session_options"],
                        contract_options=options)
        out[options["name"]] = contract.check(graph, verbose=False).kept
    return out


@pytest.mark.parametrize("importer,imported,broken", [
    ("rapid.runtime.coordinator", "rapid.server.target", ("layers",)),
    ("rapid.server.app", "rapid.runtime.tree", ("layers",)),
    ("rapid.export.trt_build", "rapid.engines.trt_engine", ("layers",)),
    ("rapid.runtime.daemon", "rapid.cli", ("layers",)),
    ("rapid.core.wire", "rapid.modeling", ("layers", "torch-free")),  # modeling imports torch: both
    ("rapid.core.geometry", "torch", ("torch-free",)),
])
def test_the_contracts_catch(graph, importer, imported, broken):
    assert all(check(graph).values())
    assert not graph.direct_import_exists(importer=importer, imported=imported)
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    try:
        kept = check(graph)
    finally:
        graph.remove_import(importer=importer, imported=imported)
    assert [name for name, ok in kept.items() if not ok] == [n for n in kept if any(b in n for b in broken)]
