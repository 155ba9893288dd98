"""librapid_rowops, kernel by kernel, on every ISA this CPU runs: each output row is bitwise
independent of the other rows, their number, the tile it lands in and the thread count; a row's
attention over (prefix ‖ ancestors) is bitwise its attention over the same keys committed; and
each kernel computes what its formula says (against torch in float64, to a tolerance)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from rapid.engines import rowops
from rapid.engines.rowops import RowKeys, RowOpsArgumentError

pytestmark = pytest.mark.skipif(not rowops.available(), reason="librapid_rowops is not built (scripts/setup.sh)")
ISAS = list(rowops.info().available) if rowops.available() else []


@pytest.fixture(params=ISAS)
def isa(request):
    default = rowops.info().isa
    rowops.select(request.param)
    yield request.param
    rowops.select(default)


def _rows_independent(f, x: torch.Tensor) -> bool:
    """f(x[a:b]) is bitwise f(x)[a:b] for every prefix and every single row."""
    full = f(x)
    m = x.shape[0]
    return (all(torch.equal(f(x[:k].contiguous()), full[:k]) for k in range(1, m + 1))
            and all(torch.equal(f(x[k:k + 1].contiguous())[0], full[k]) for k in range(m)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, n", [(64, 259), (1536, 256), (37, 45), (130, 16)])  # tails in N and odd K
def test_linear_rows_do_not_depend_on_the_row_count_or_threads(isa, dtype, k, n):
    g = torch.Generator().manual_seed(k * n)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g)
    x = torch.randn(70, k, generator=g)  # M past every row tile and past 32 and 64
    pw = rowops.pack(w)
    assert _rows_independent(lambda t: rowops.linear(t, pw, b), x)
    full = rowops.linear(x, pw, b)
    assert all(torch.equal(rowops.linear(x, pw, b, threads=t), full) for t in (2, 3, 5))
    ref = x.double() @ w.double().T + b.double()
    tol = 0.05 * math.sqrt(k) if dtype == torch.bfloat16 and isa in ("amx", "avx512bf16") else 1e-4 * math.sqrt(k)
    assert torch.allclose(full.double(), ref, atol=tol), (full.double() - ref).abs().max()


@pytest.mark.parametrize("k, n", [(1536, 8960), (8960, 1536), (1536, 151936)])
def test_linear_at_the_default_targets_shapes(k, n):
    """The real projections and LM head, M from 1 to 40 (bf16 library GEMMs changed from M = 33)."""
    g = torch.Generator().manual_seed(n)
    pw = rowops.pack(torch.randn(n, k, generator=g).to(torch.bfloat16))
    x = torch.randn(40, k, generator=g)
    full = rowops.linear(x, pw)
    for m in (1, 2, 3, 8, 17, 32, 33, 40):
        assert torch.equal(rowops.linear(x[:m].contiguous(), pw), full[:m]), m
    assert torch.equal(rowops.linear(x[39:].contiguous(), pw)[0], full[39])
    assert torch.equal(rowops.linear(x, pw, threads=2), full)


def test_a_weight_packed_for_another_isa_is_refused(isa):
    pw = rowops.pack(torch.randn(16, 16))
    other = next((i for i in ISAS if i != isa), None)
    if other is None:
        pytest.skip("this CPU runs one ISA")
    rowops.select(other)
    with pytest.raises(RowOpsArgumentError, match="packed for"):
        rowops.linear(torch.randn(2, 16), pw)


def test_rms_norm_rope_silu_rows_are_independent_and_right(isa):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 1536, generator=g)
    w = torch.randn(1536, generator=g).to(torch.bfloat16)
    assert _rows_independent(lambda t: rowops.rms_norm(t, w, 1e-6), x)
    ref = w.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(rowops.rms_norm(x, w, 1e-6).double(), ref, atol=1e-4)
    u = torch.randn(40, 1536, generator=g)
    gu = torch.cat((x, u), 1)  # each row carries its own g and u
    assert _rows_independent(lambda t: rowops.silu_mul(t[:, :1536].contiguous(), t[:, 1536:].contiguous()), gu)
    assert torch.allclose(rowops.silu_mul(x, u).double(), torch.nn.functional.silu(x.double()) * u.double(), atol=1e-5)
    q = torch.randn(40, 12, 128, generator=g)
    cos, sin = torch.randn(40, 128, generator=g), torch.randn(40, 128, generator=g)
    want = q.double() * cos[:, None].double() + torch.cat((-q[..., 64:], q[..., :64]), -1).double() * sin[:, None].double()
    for m in (1, 7, 40):
        got = q[:m].clone()
        rowops.rope(got, cos[:m].contiguous(), sin[:m].contiguous())
        assert torch.equal(got, _rope_all(q, cos, sin)[:m])
    assert torch.allclose(_rope_all(q, cos, sin).double(), want, atol=1e-5)


def _rope_all(q, cos, sin):
    out = q.clone()
    rowops.rope(out, cos, sin)
    return out


def _keys(kv_k, kv_v, plen, anc):
    """RowKeys over one session buffer ``[L=1, KVH, cap, d]`` for rows with prefix ``plen[u]`` and
    new-row lists ``anc[u]``."""
    u = len(plen)
    kvh, cap, d = kv_k.shape[1:]
    t = lambda xs: torch.as_tensor(xs, dtype=torch.long)  # noqa: E731
    off = [0]
    for a in anc:
        off.append(off[-1] + len(a))
    return RowKeys(t([kv_k.data_ptr()] * u), t([kv_v.data_ptr()] * u), t(plen), t([cap * d] * u),
                   t([kvh * cap * d] * u), kv_k.element_size(), t(off), t([r for a in anc for r in a]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_over_ancestors_is_attention_over_the_same_keys_committed(isa, dtype):
    """Row u of a tree (prefix P, ancestors a_1 … a_i) and the one-token step after committing
    a_1 … a_{i-1} read the same keys in the same order: bitwise equal, whatever else is in the
    buffer past them (capacity, stale keys) and whatever other rows share the call."""
    g = torch.Generator().manual_seed(4)
    heads, kvh, d, cap, p = 12, 2, 128, 300, 70
    kv_k = torch.randn(1, kvh, cap, d, generator=g).to(dtype)  # stale values past the prefix too
    kv_v = torch.randn(1, kvh, cap, d, generator=g).to(dtype)
    new_k = torch.randn(kvh, 6, d, generator=g).to(dtype)
    new_v = torch.randn(kvh, 6, d, generator=g).to(dtype)
    q = torch.randn(6, heads, d, generator=g)
    anc = [[0], [0, 1], [0, 1, 2], [0, 3], [0, 1, 2, 4], [0, 3, 5]]  # a tree with holes
    tree = rowops.attention(q, new_k, new_v, _keys(kv_k, kv_v, [p] * 6, anc), 0, 0.088)
    for u, path in enumerate(anc):
        step_k, step_v = kv_k.clone(), kv_v.clone()  # the ancestors committed after the prefix
        for i, r in enumerate(path[:-1]):
            step_k[0, :, p + i], step_v[0, :, p + i] = new_k[:, r], new_v[:, r]
        one = rowops.attention(q[u:u + 1].contiguous(), new_k[:, path[-1]:path[-1] + 1].contiguous(),
                               new_v[:, path[-1]:path[-1] + 1].contiguous(),
                               _keys(step_k, step_v, [p + len(path) - 1], [[0]]), 0, 0.088)
        assert torch.equal(one[0], tree[u]), u
    s = torch.einsum("hd,hjd->hj", q[5].double(), torch.cat((kv_k[0, :, :p], new_k[:, [0, 3, 5]]), 1)
                     .double().repeat_interleave(6, 0)) * 0.088
    want = torch.einsum("hj,hjd->hd", s.softmax(-1), torch.cat((kv_v[0, :, :p], new_v[:, [0, 3, 5]]), 1)
                        .double().repeat_interleave(6, 0))
    assert torch.allclose(tree[5].double(), want, atol=1e-5)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(RowOpsArgumentError, match="float32"):
        rowops.linear(torch.randn(2, 16).double(), rowops.pack(torch.randn(4, 16)))
    with pytest.raises(RowOpsArgumentError, match="x \\(2, 8\\)"):
        rowops.linear(torch.randn(2, 8), rowops.pack(torch.randn(4, 16)))
    with pytest.raises(RowOpsArgumentError, match="not one this CPU runs"):
        rowops.select("sve2")


def test_the_library_answers_from_many_threads_at_once():
    """Two engines' drafting threads call the kernels together. ``rapid_rowops_available`` once
    rebuilt one global string on every call (and ``linear`` asked for it on every call), so a
    thread read it while another cleared it: garbage, a UnicodeDecodeError in a request (CI, the
    daemon's concurrent-requests test). Its pointer and text must stay fixed; and ``linear`` from
    many threads gives each thread the bitwise answer of one thread alone."""
    lib = rowops._lib()
    first = lib.rapid_rowops_available()
    g = torch.Generator().manual_seed(3)
    w = rowops.pack(torch.randn(48, 32, generator=g))
    x = torch.randn(5, 32, generator=g)
    want = rowops.linear(x, w)
    bad: list[object] = []

    def hammer() -> None:
        for i in range(4000):
            got = lib.rapid_rowops_available()
            if got != first:
                bad.append(got)
                return
            if i % 50 == 0 and not torch.equal(rowops.linear(x, w), want):
                bad.append("linear")
                return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and rowops.info().available == tuple(first.decode().split(","))
