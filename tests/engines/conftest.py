"""Shared fixture for the engine tests: the native KV-cache libraries, built once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rapid.engines import native

# helper modules imported by the tests: keep pytest's detailed assertion messages in them
pytest.register_assert_rewrite("trt_emulation", "trt_emulation_engine", "kvops_cases")


def _cxx_compiler() -> str | None:
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return c
    return None


@pytest.fixture(scope="session")
def kvops() -> Path:
    """Folder holding the freshly built (or RAPID_KVOPS_DIR's prebuilt) libraries."""
    prebuilt = os.environ.get("RAPID_KVOPS_DIR")
    if prebuilt:
        native.reload()
        if not native.cpu_available():
            pytest.fail(f"RAPID_KVOPS_DIR={prebuilt}: {native.cpu_status()}")
        return Path(prebuilt)
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found on PATH: cannot build the native KV kernels")
    if _cxx_compiler() is None:
        pytest.skip("no C++ compiler (c++/g++/clang++) found: cannot build the native KV kernels")
    out = native.build()  # incremental: a no-op when up to date
    assert native.cpu_available(), native.cpu_status()
    return out


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """(model folder, export folder) for a tiny random Qwen2 (hidden 64, 2 layers), fp32."""
    from rapid.export.onnx_export import export_onnx
    from rapid.tiny import build_tiny

    root = tmp_path_factory.mktemp("conformance")
    model = build_tiny(root / "model", "qwen2", seed=3)
    export_onnx(str(model), root / "export", max_context=256, max_tree=32, progress=False)
    return model, root / "export"


@pytest.fixture(scope="session")
def tiny_export_fp16(tiny_export, tmp_path_factory):
    """The same model exported as an fp16 graph (norms, RoPE angles and softmax cast to fp32)."""
    from rapid.export.onnx_export import export_onnx

    out = tmp_path_factory.mktemp("conformance-fp16") / "export"
    export_onnx(str(tiny_export[0]), out, dtype="fp16", max_context=256, max_tree=32, progress=False)
    return out
