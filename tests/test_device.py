"""rapid.core.device: --device resolution (pure; the CUDA paths run in scripts/device_check.sh)."""

from __future__ import annotations

import pytest

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
