"""rapid.core.device: --device resolution (pure; the CUDA paths run in scripts/device_check.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rapid.core.device import UnsupportedDeviceError, choose_device


@pytest.mark.parametrize("requested, count, want", [
    ("auto", 0, "cpu"), ("auto", 2, "cuda:0"), ("cpu", 2, "cpu"), ("cuda", 1, "cuda:0"), ("cuda:1", 2, "cuda:1"),
])
def test_choose_device(requested, count, want):
    assert choose_device(requested, count) == want


@pytest.mark.parametrize("requested, count, why", [
    ("cuda", 0, "no usable CUDA device"), ("cuda:2", 2, "has 2 CUDA device"), ("gpu", 1, "expected auto, cpu"),
    ("cuda:x", 1, "expected auto, cpu"),
])
def test_bad_devices_are_one_line_errors(requested, count, why):
    with pytest.raises(UnsupportedDeviceError, match=why) as e:
        choose_device(requested, count)
    assert "\n" not in str(e.value)


def test_device_check_script_resolves_its_imports_and_says_why_it_stops_without_cuda():
    """scripts/device_check.py runs only where a GPU is lent, so its first line of defence is
    here: every module and name it imports exists, and without CUDA it stops with a reason."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: scripts/device_check.sh runs the whole check")
    script = Path(__file__).resolve().parent.parent / "scripts" / "device_check.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "no CUDA device visible to torch" in out.stdout
