"""Building the native KV kernels with cmake, and where the build lands by default.

Owns :data:`REPO_ROOT`, :data:`DEFAULT_BUILD_DIR`, :class:`KVOpsBuildError` and
:func:`cmake_build` (configure + compile, serialised per build folder by a file lock).
:func:`rapid.engines.native.build` wraps it and points the library search at the result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from rapid.core.errors import RapidError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "kvops"


class KVOpsBuildError(RapidError):
    """Building the native KV kernels failed (or cmake is missing)."""


def cmake_build(source_dir: str | os.PathLike[str] | None = None,
                build_dir: str | os.PathLike[str] | None = None, *, cuda: bool | None = None,
                build_type: str = "Release", jobs: int | None = None,
                timeout: float | None = 1800) -> Path:
    """Configure and build the kernels with cmake; returns the build folder (not reloaded).

    Arguments as :func:`rapid.engines.native.build`. Raises :class:`KVOpsBuildError` when
    cmake is missing or the build fails.
    """
    cmake = shutil.which("cmake")
    if cmake is None:
        raise KVOpsBuildError(
            "cmake not found on PATH: install cmake >= 3.18 and a C++17 compiler "
            "(e.g. `apt install cmake g++` or `pip install cmake`), or point RAPID_KVOPS_DIR "
            "at a folder holding prebuilt librapid_kvops")
    src = Path(source_dir) if source_dir is not None else REPO_ROOT
    if not (src / "CMakeLists.txt").is_file() or not (src / "engines" / "kvops").is_dir():
        raise KVOpsBuildError(f"{src} holds no kvops sources (CMakeLists.txt, engines/kvops)")
    out = Path(build_dir) if build_dir is not None else DEFAULT_BUILD_DIR
    out.mkdir(parents=True, exist_ok=True)
    configure = [cmake, "-S", str(src), "-B", str(out), f"-DCMAKE_BUILD_TYPE={build_type}"]
    if cuda is not None:
        configure.append(f"-DRAPID_KVOPS_CUDA={'ON' if cuda else 'OFF'}")
    compile_ = [cmake, "--build", str(out), "--config", build_type, "-j",
                str(jobs or os.cpu_count() or 1)]
    with _build_lock(out):
        for cmd in (configure, compile_):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise KVOpsBuildError(f"`{' '.join(cmd)}` timed out after {timeout}s") from e
            if r.returncode != 0:
                tail = (r.stdout + r.stderr)[-4000:]
                raise KVOpsBuildError(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{tail}")
    return out


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Exclusive lock on ``<folder>/.rapid_kvops.lock`` (POSIX; a no-op elsewhere), so
    concurrent test sessions do not run cmake in one build folder at once."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(folder / ".rapid_kvops.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
