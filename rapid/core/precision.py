"""Which floating-point type a model runs in: ``--dtype auto|bfloat16|float32|float64`` (torch-free).

``auto`` picks bfloat16 where the hardware computes it natively and float32 elsewhere:

    auto → bfloat16   on CUDA, or a CPU with AVX512_BF16 / AMX-BF16 (x86) or BF16 (Arm)
    auto → float32    otherwise: the weights stay the model's full-precision values

An explicit bfloat16 on a CPU without native bf16 runs only where the target runs on the row
kernels (``row_kernels``: ``librapid_rowops`` built): they widen each bf16 weight exactly to fp32
and compute in fp32, so half the bytes stream per step (measured on an AVX2 Zen 3: a one-token
step 208 ms against 325 ms in float32). Anywhere else (torch's emulated bf16) it is an error
with one line saying so, never a silent slow path. On a bf16 CPU a multi-token forward costs
about what a one-token forward does (the verify curve is flat up to ~8 tokens), which is what
makes tree verification pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rapid.core.errors import RapidError

DTYPES = ("auto", "bfloat16", "float32", "float64")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 / AMX, Arm (/proc/cpuinfo names)


class UnsupportedDtypeError(RapidError):
    """The requested dtype cannot run natively on this device."""


@dataclass(slots=True, frozen=True)
class DtypeChoice:
    dtype: str  # a torch dtype name: "bfloat16", "float32", "float64"
    reason: str  # one line for logs and ``rapid doctor``


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of the first processor (empty where /proc/cpuinfo does not exist)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str]) -> str | None:
    """The flag that gives this CPU native bf16 arithmetic, or None."""
    return next((f for f in BF16_CPU_FLAGS if f in flags), None)


def choose_dtype(requested: str, device: str, flags: frozenset[str], row_kernels: bool = False) -> DtypeChoice:
    """Resolve ``requested`` for ``device`` ("cpu" or "cuda…") given the CPU's ``flags`` and
    whether the target's row kernels are built (module docstring)."""
    if requested not in DTYPES:
        raise UnsupportedDtypeError(f"dtype {requested!r} is not one of {', '.join(DTYPES)}")
    cuda = device.startswith("cuda")
    flag = native_bf16(flags)
    if requested == "auto":
        if cuda:
            return DtypeChoice("bfloat16", "auto: CUDA computes bf16 natively")
        if flag:
            return DtypeChoice("bfloat16", f"auto: this CPU has {flag.upper()} (native bf16)")
        return DtypeChoice("float32", "auto: this CPU has no AVX512_BF16/AMX/BF16 (--dtype bfloat16 halves the "
                           "bytes per step on the row kernels)")
    if requested == "bfloat16" and not cuda and flag is None:
        if row_kernels:
            return DtypeChoice("bfloat16", "as requested: bf16 weights widened to fp32 in the row kernels "
                               "(no native bf16 on this CPU)")
        raise UnsupportedDtypeError("bfloat16 needs a CPU with AVX512_BF16, AMX-BF16 or Arm BF16, or the row "
                                    "kernels (scripts/setup.sh builds them); use --dtype float32 or auto")
    return DtypeChoice(requested, "as requested")
