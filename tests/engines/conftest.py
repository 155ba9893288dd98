"""Shared fixture for the engine tests: the native KV-cache libraries, built once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rapid.engines import native

# helper modules imported by the tests: keep pytest's detailed assertion messages in them
pytest.register_assert_rewrite("trt_emulation", "kvops_cases")


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
