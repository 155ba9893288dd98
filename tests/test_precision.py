"""``--dtype auto``: bf16 where the hardware has it, fp32 elsewhere, one-line errors."""

from __future__ import annotations

import pytest

from rapid.core.precision import UnsupportedDtypeError, choose_dtype, cpu_flags

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
AVX2_ONLY = frozenset({"avx2", "fma"})


def test_auto_picks_bf16_only_where_native():
    assert choose_dtype("auto", "cpu", ZEN4).dtype == "bfloat16"
    assert choose_dtype("auto", "cpu", frozenset({"amx_bf16"})).dtype == "bfloat16"
    assert choose_dtype("auto", "cpu", frozenset({"bf16", "asimd"})).dtype == "bfloat16"  # Arm
    fp32 = choose_dtype("auto", "cpu", AVX2_ONLY)
    assert fp32.dtype == "float32" and "no AVX512_BF16" in fp32.reason
    assert choose_dtype("auto", "cpu", AVX2_ONLY, row_kernels=True).dtype == "float32"  # auto keeps full precision
    assert choose_dtype("auto", "cuda:0", AVX2_ONLY).dtype == "bfloat16"


def test_explicit_choices():
    assert choose_dtype("float32", "cpu", ZEN4).dtype == "float32"
    assert choose_dtype("bfloat16", "cuda", frozenset()).dtype == "bfloat16"
    with pytest.raises(UnsupportedDtypeError, match="AVX512_BF16"):
        choose_dtype("bfloat16", "cpu", AVX2_ONLY)  # torch's emulated bf16
    widened = choose_dtype("bfloat16", "cpu", AVX2_ONLY, row_kernels=True)  # bf16 weights, fp32 arithmetic
    assert widened.dtype == "bfloat16" and "row kernels" in widened.reason
    with pytest.raises(UnsupportedDtypeError, match="not one of"):
        choose_dtype("bf16", "cpu", ZEN4)


def test_cpu_flags_reads_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(f) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert cpu_flags(tmp_path / "missing") == frozenset()
