"""The edge runs without torch: every edge-side module imports, and ``rapid edge --help`` and
``rapid doctor`` work, in a subprocess where torch (and onnx, the exporter's: ``.[edge]`` has
neither) cannot be imported.

The blocker makes them look absent the way a torch-free install does: ``import torch`` fails
and ``importlib.util.find_spec("torch")`` (what transformers asks) answers None; a
``sys.meta_path`` finder refuses every ``torch.*`` / ``onnx.*`` submodule. The real install of ``.[edge]`` in
a fresh virtualenv is ``scripts/edge_check.sh`` (run by ``scripts/test.sh``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCKER = '''
import sys

class _NoTorch:
    """A meta-path finder that refuses torch, onnx and their submodules (onnxruntime stays)."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "onnx"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the edge has no {name})", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
sys.modules["torch"] = None  # `import torch` fails; importlib.util.find_spec("torch") is None
sys.modules["onnx"] = None
'''
EDGE_MODULES = [
    "rapid", "rapid.cli", "rapid.doctor", "rapid.models",
    "rapid.engines.base", "rapid.engines.cuda", "rapid.engines.kvops_abi", "rapid.engines.kvops_build",
    "rapid.engines.kvops_cuda", "rapid.engines.kvops_numpy", "rapid.engines.native", "rapid.engines.ort_engine",
    "rapid.engines.select", "rapid.engines.trt_engine", "rapid.engines.trt_io", "rapid.engines.trt_layout",
]
TORCH_SIDE = {"rapid.engines.torch_engine", "rapid.engines.rowops", "rapid.engines.row_linear"}  # torch by definition: the PyTorch draft backend, the row kernels (torch tensors) and its projections on them


def edge_modules() -> list[str]:
    """The fixed list plus every rapid.core and rapid.runtime module (a new one is covered without editing this file)."""
    core = sorted(f"rapid.core.{p.stem}" for p in (REPO / "rapid" / "core").glob("*.py") if p.stem != "__init__")
    runtime = sorted(f"rapid.runtime.{p.stem}" for p in (REPO / "runtime").glob("*.py") if p.stem != "__init__")
    engines = sorted(f"rapid.engines.{p.stem}" for p in (REPO / "engines").glob("*.py") if p.stem != "__init__")
    assert set(engines) - set(EDGE_MODULES) <= TORCH_SIDE, "a new engine module: list it as edge or torch side"
    return EDGE_MODULES + core + runtime


def run_blocked(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_edge_modules_import_without_torch():
    code = f'''
import importlib, json
failed = {{}}
for m in {edge_modules()!r}:
    try:
        importlib.import_module(m)
    except Exception as e:
        failed[m] = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"failed": failed, "torch": sys.modules.get("torch") is not None}}))
'''
    r = run_blocked(code)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"failed": {}, "torch": False}


def test_edge_help_and_doctor_without_torch():
    code = '''
from rapid.cli import main
try:
    main(["edge", "--help"])
except SystemExit as e:
    assert e.code == 0, e.code
assert main(["doctor"]) == 0
assert sys.modules.get("torch") is None
'''
    r = run_blocked(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--engine" in r.stdout and "--cloud" in r.stdout
    ort_line = next(line for line in r.stdout.splitlines() if line.startswith("onnxruntime"))
    assert "really working ['CPUExecutionProvider'" in ort_line or "'CPUExecutionProvider']" in ort_line, ort_line
    torch_line = next(line for line in r.stdout.splitlines() if line.startswith("torch"))
    assert "not installed" in torch_line, torch_line
