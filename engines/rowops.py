"""ctypes bindings of ``librapid_rowops`` (``server/kernels``): row-invariant CPU kernels, used by the
target's verify forward (``rapid.server.row_forward``) and the PyTorch draft's projections
(``rapid.engines.row_linear``).

Each wrapper takes torch CPU tensors (C-contiguous; activations float32, weights and KV float32
or bfloat16) and writes into a fresh or given output. Why every output row depends on that
row's inputs alone — not on the row count, the tile it lands in, other chains, other sessions,
padding keys or threads — is written in ``server/kernels/rowops_impl.h``.

The library is built by ``scripts/setup.sh`` (CMake, next to the KV kernels) and searched in
the same folders as those (``rapid.engines.native.search_dirs``). The ISA is chosen once per
process: ``$RAPID_ROW_ISA`` (``amx``, ``avx512bf16``, ``avx512``, ``avx2``, ``generic``) or the best this CPU runs;
:func:`select` switches it (tests compare every ISA the machine has).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from rapid.core.errors import RapidError
from rapid.engines.kvops_abi import _lib_filename
from rapid.engines.native import search_dirs

LIB = "rapid_rowops"
ABI_VERSION = 1
WDTYPES = {torch.float32: 0, torch.bfloat16: 1}  # weight / KV element codes of rowops.h

vp, i64, c_int, c_float = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


class RowOpsUnavailable(RapidError):
    """``librapid_rowops`` is not built or cannot load here."""


class RowOpsArgumentError(RapidError):
    """A kernel refused its arguments (a shape or dtype the kernels do not take)."""


@dataclass(slots=True, frozen=True)
class RowOpsInfo:
    path: str  # the loaded library
    isa: str  # the ISA in use
    available: tuple[str, ...]  # the ISAs this CPU runs


@functools.cache
def _lib() -> ctypes.CDLL:
    fname = _lib_filename(LIB)
    path = next((d / fname for d in search_dirs() if (d / fname).is_file()), None)
    if path is None:
        raise RowOpsUnavailable(f"{fname} not found (searched {', '.join(map(str, search_dirs()))}); "
                                "run scripts/setup.sh or `cmake -S . -B build/kvops && cmake --build build/kvops`")
    lib = ctypes.CDLL(str(path))
    lib.rapid_rowops_abi_version.restype = c_int
    if lib.rapid_rowops_abi_version() != ABI_VERSION:
        raise RowOpsUnavailable(f"{path} has ABI {lib.rapid_rowops_abi_version()}, expected {ABI_VERSION}: rebuild it")
    for name in ("rapid_rowops_isa", "rapid_rowops_available"):
        getattr(lib, name).restype = ctypes.c_char_p
    lib.rapid_rowops_select.argtypes = [ctypes.c_char_p]
    lib.rapid_rowops_packed_size.restype = i64
    lib.rapid_rowops_packed_size.argtypes = [c_int, i64, i64]
    lib.rapid_rowops_pack.argtypes = [c_int, vp, i64, i64, vp]
    lib.rapid_rowops_linear.argtypes = [c_int, vp, i64, i64, vp, i64, vp, vp, c_int]
    lib.rapid_rowops_rms_norm.argtypes = [c_int, vp, i64, i64, vp, c_float, vp]
    lib.rapid_rowops_rope.argtypes = [vp, i64, i64, i64, vp, vp]
    lib.rapid_rowops_silu_mul.argtypes = [vp, vp, i64, i64, vp]
    lib.rapid_rowops_attention.argtypes = [c_int, vp, vp, i64, i64, i64, i64, c_float, vp, vp, vp, vp, vp, vp, i64,
                                           vp, vp]
    lib._rapid_path = str(path)
    lib._rapid_available = tuple(lib.rapid_rowops_available().decode().split(","))  # fixed for the process
    return lib


def available() -> bool:
    try:
        _lib()
    except (RowOpsUnavailable, OSError):
        return False
    return True


def info() -> RowOpsInfo:
    lib = _lib()
    return RowOpsInfo(lib._rapid_path, current_isa(), lib._rapid_available)


def current_isa() -> str:
    """The ISA the kernels run now: one read of a constant string, safe from any thread (the
    kernels check it on every call)."""
    return _lib().rapid_rowops_isa().decode()


def select(isa: str) -> None:
    """Use ``isa`` from now on (raises where this CPU cannot run it). Not while a kernel runs in
    another thread: the dispatch table is one process-wide value (tests switch it between runs)."""
    if _lib().rapid_rowops_select(isa.encode()) != 0:
        raise RowOpsArgumentError(f"ISA {isa!r} is not one this CPU runs ({', '.join(info().available)})")


def _check(rc: int, op: str) -> None:
    if rc != 0:
        raise RowOpsArgumentError(f"rowops {op}: arguments refused (rc {rc})")


def _f32(t: torch.Tensor, name: str) -> int:
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise RowOpsArgumentError(f"rowops: {name} must be a contiguous float32 CPU tensor (got {t.dtype}, {t.device})")
    return t.data_ptr()


def _code(t: torch.Tensor, name: str) -> int:
    if t.dtype not in WDTYPES or not t.is_contiguous() or t.device.type != "cpu":
        raise RowOpsArgumentError(f"rowops: {name} must be a contiguous float32/bfloat16 CPU tensor (got {t.dtype})")
    return WDTYPES[t.dtype]


@dataclass(slots=True, frozen=True)
class PackedWeight:
    """An ``nn.Linear`` weight ``[N, K]`` in the packed layout of the ISA it was packed under."""

    data: torch.Tensor  # flat, the ISA's layout (rowops_impl.h)
    n: int  # out features
    k: int  # in features
    code: int  # 0 float32, 1 bfloat16
    isa: str


def pack(w: torch.Tensor) -> PackedWeight:
    """Pack ``w [N, K]`` (float32 or bfloat16) for :func:`linear` under the current ISA."""
    n, k = w.shape
    w = w.contiguous()
    code = _code(w, "w")
    size = _lib().rapid_rowops_packed_size(code, n, k)
    out = torch.empty(size, dtype=w.dtype).fill_(0)  # faulted in by one sequential pass first
    _check(_lib().rapid_rowops_pack(code, w.data_ptr(), n, k, out.data_ptr()), "pack")
    return PackedWeight(out, n, k, code, current_isa())


def linear(x: torch.Tensor, w: PackedWeight, b: torch.Tensor | None = None, threads: int = 1) -> torch.Tensor:
    """``x [M, K]`` float32 → ``x wᵀ + b`` ``[M, N]`` float32 (``b [N]`` float32)."""
    m, k = x.shape
    if w.k != k or (b is not None and b.shape != (w.n,)):
        raise RowOpsArgumentError(f"rowops linear: x {tuple(x.shape)}, w {(w.n, w.k)}, b {None if b is None else tuple(b.shape)}")
    isa = current_isa()
    if w.isa != isa:
        raise RowOpsArgumentError(f"rowops linear: weight packed for {w.isa}, the kernels now run {isa}")
    y = torch.empty((m, w.n), dtype=torch.float32)
    _check(_lib().rapid_rowops_linear(w.code, _f32(x, "x"), m, k, w.data.data_ptr(), w.n,
                                      None if b is None else _f32(b, "b"), y.data_ptr(), threads), "linear")
    return y


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [M, K]`` float32, ``w [K]`` → ``[M, K]`` float32."""
    m, k = x.shape
    if w.shape != (k,):
        raise RowOpsArgumentError(f"rowops rms_norm: x {tuple(x.shape)}, w {tuple(w.shape)}")
    y = torch.empty_like(x)
    _check(_lib().rapid_rowops_rms_norm(_code(w, "w"), _f32(x, "x"), m, k, w.data_ptr(), eps, y.data_ptr()), "rms_norm")
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place on ``x [U, H, d]`` with ``cos``/``sin`` ``[U, d]`` (float32)."""
    u, h, d = x.shape
    if cos.shape != (u, d) or sin.shape != (u, d):
        raise RowOpsArgumentError(f"rowops rope: x {tuple(x.shape)}, cos {tuple(cos.shape)}")
    _check(_lib().rapid_rowops_rope(_f32(x, "x"), u, h, d, _f32(cos, "cos"), _f32(sin, "sin")), "rope")


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` for ``[M, N]`` float32."""
    if g.shape != u.shape:
        raise RowOpsArgumentError(f"rowops silu_mul: {tuple(g.shape)} vs {tuple(u.shape)}")
    y = torch.empty_like(g)
    _check(_lib().rapid_rowops_silu_mul(_f32(g, "g"), _f32(u, "u"), g.shape[0], g.shape[1], y.data_ptr()), "silu_mul")
    return y


@dataclass(slots=True)
class RowKeys:
    """Which keys each of U rows attends (``int64`` tensors, kept alive for the forward).

    Row u sees its session prefix keys ``0 .. plen[u]-1`` (layer block at ``k_base[u]`` /
    ``v_base[u]`` plus ``layer · layer_stride[u]`` elements; heads ``head_stride[u]`` apart),
    then the new rows ``anc_idx[anc_off[u] : anc_off[u+1]]`` in that order (its ancestors, then
    itself)."""

    k_base: torch.Tensor  # [U] addresses of each row's session K buffer (layer 0)
    v_base: torch.Tensor  # [U]
    plen: torch.Tensor  # [U] prefix keys per row
    head_stride: torch.Tensor  # [U] elements between kv heads (capacity · d)
    layer_stride: torch.Tensor  # [U] elements between layers (kv_heads · capacity · d)
    elem: int  # bytes per KV element
    anc_off: torch.Tensor  # [U+1] CSR offsets
    anc_idx: torch.Tensor  # [sum] new-row indices


def attention(q: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, keys: RowKeys, layer: int,
              scale: float) -> torch.Tensor:
    """``q [U, H, d]`` float32, ``new_k``/``new_v`` ``[KVH, U, d]`` in the KV dtype → ``[U, H, d]``."""
    u, h, d = q.shape
    kvh = new_k.shape[0]
    if new_k.shape != (kvh, u, d) or new_v.shape != new_k.shape or new_v.dtype != new_k.dtype:
        raise RowOpsArgumentError(f"rowops attention: q {tuple(q.shape)}, new k {tuple(new_k.shape)}")
    code = _code(new_k, "new_k")
    off = keys.layer_stride * (layer * keys.elem)
    pk, pv = keys.k_base + off, keys.v_base + off
    out = torch.empty_like(q)
    _check(_lib().rapid_rowops_attention(
        code, _f32(q, "q"), out.data_ptr(), u, h, kvh, d, scale, pk.data_ptr(), pv.data_ptr(), keys.plen.data_ptr(),
        keys.head_stride.data_ptr(), new_k.data_ptr(), new_v.data_ptr(), u * d, keys.anc_off.data_ptr(),
        keys.anc_idx.data_ptr()), "attention")
    return out
