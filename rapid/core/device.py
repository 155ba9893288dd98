"""Which device a model runs on: ``--device auto|cpu|cuda|cuda:N`` (torch-free).

    auto   → cuda:0 where a CUDA device is visible, else cpu
    cuda   → cuda:0
    cuda:N → that device; an error with one line when it does not exist
"""

from __future__ import annotations

import re

from rapid.core.errors import RapidError

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(?::(\d+))?")


class UnsupportedDeviceError(RapidError):
    """The requested device is malformed or not present on this machine."""


def check_device_name(requested: str) -> re.Match[str]:
    """``requested`` parsed as auto|cpu|cuda|cuda:N, or UnsupportedDeviceError (before anything
    loads: whether the device exists is known only once torch is imported)."""
    m = DEVICE_PATTERN.fullmatch(requested)
    if m is None:
        raise UnsupportedDeviceError(f"--device {requested!r}: expected auto, cpu, cuda or cuda:N")
    return m


def choose_device(requested: str, cuda_devices: int) -> str:
    """Resolve ``requested`` given how many CUDA devices are visible (see the module docstring)."""
    m = check_device_name(requested)
    if requested == "auto":
        return "cuda:0" if cuda_devices > 0 else "cpu"
    if requested == "cpu":
        return "cpu"
    index = int(m.group(1) or 0)
    if index >= cuda_devices:
        have = f"{cuda_devices} CUDA device(s)" if cuda_devices else "no usable CUDA device (driver, GPU or a CUDA build of torch)"
        raise UnsupportedDeviceError(f"--device {requested}: this machine has {have}")
    return f"cuda:{index}"
