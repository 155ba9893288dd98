// Dispatch of librapid_rowops: the ISA is picked once, never per call (see rowops.h).
#include "rowops.h"

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rowops_table.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define API extern "C" __attribute__((visibility("default")))

namespace {

constexpr const char* ISAS[] = {"amx", "avx512bf16", "avx512", "avx2", "generic"};  // best first

// Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); a kernel or VM that refuses it leaves AMX off and avx512bf16 in use.
bool amx_permitted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return ok;
#else
    return false;
#endif
}

bool runs(const char* isa) {
#if defined(ROWOPS_X86)
    __builtin_cpu_init();  // g_ops is picked by a static initializer, maybe before libgcc's own
#if defined(ROWOPS_AMX_BUILT)
    if (!std::strcmp(isa, "amx"))
        return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
               __builtin_cpu_supports("avx512bf16") && amx_permitted();
#endif
    if (!std::strcmp(isa, "avx512bf16")) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    if (!std::strcmp(isa, "avx512")) return __builtin_cpu_supports("avx512f");
    if (!std::strcmp(isa, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return !std::strcmp(isa, "generic");
}

RowOpsTable table_of(const char* isa) {
#if defined(ROWOPS_X86)
#if defined(ROWOPS_AMX_BUILT)
    if (!std::strcmp(isa, "amx")) return rowops_table_amx();
#endif
    if (!std::strcmp(isa, "avx512bf16")) return rowops_table_avx512bf16();
    if (!std::strcmp(isa, "avx512")) return rowops_table_avx512();
    if (!std::strcmp(isa, "avx2")) return rowops_table_avx2();
#endif
    (void)isa;
    return rowops_table_generic();
}

RowOpsTable pick() {
    const char* env = std::getenv("RAPID_ROW_ISA");
    if (env && *env && runs(env)) return table_of(env);
    for (const char* isa : ISAS)
        if (runs(isa)) return table_of(isa);
    return rowops_table_generic();
}

RowOpsTable g_ops = pick();

// Built once (a function-local static: initialised once, thread-safe) and never written again.
// It was rebuilt on every call into one global string, so two threads asking at once (the
// draft's projections on two engines) read it while the other cleared it: garbage bytes, a
// UnicodeDecodeError in the caller, a heap race.
const std::string& available_isas() {
    static const std::string list = [] {
        std::string s;
        for (const char* isa : ISAS)
            if (runs(isa)) s += (s.empty() ? "" : ",") + std::string(isa);
        return s;
    }();
    return list;
}

}  // namespace

API int rapid_rowops_abi_version(void) { return RAPID_ROWOPS_ABI_VERSION; }
API const char* rapid_rowops_isa(void) { return g_ops.name; }

API const char* rapid_rowops_available(void) { return available_isas().c_str(); }

API int rapid_rowops_select(const char* isa) {
    if (!isa || !runs(isa)) return -1;
    g_ops = table_of(isa);
    return 0;
}

API int64_t rapid_rowops_packed_size(int wdtype, int64_t N, int64_t K) {
    if ((wdtype != 0 && wdtype != 1) || N < 0 || K < 0) return RAPID_ROWOPS_ERR_ARG;
    return wdtype == 0 ? g_ops.packed_size_f32(N, K) : g_ops.packed_size_bf16(N, K);
}

API int rapid_rowops_pack(int wdtype, const void* w, int64_t N, int64_t K, void* out) {
    if ((wdtype != 0 && wdtype != 1) || N < 0 || K < 0) return RAPID_ROWOPS_ERR_ARG;
    if (wdtype == 0) g_ops.pack_f32(static_cast<const float*>(w), N, K, static_cast<float*>(out));
    else g_ops.pack_bf16(static_cast<const uint16_t*>(w), N, K, static_cast<uint16_t*>(out));
    return 0;
}

API int rapid_rowops_linear(int wdtype, const float* x, int64_t M, int64_t K, const void* wp, int64_t N,
                            const float* b, float* y, int threads) {
    if ((wdtype != 0 && wdtype != 1) || M < 0 || K < 0 || N < 0 || threads < 1) return RAPID_ROWOPS_ERR_ARG;
    auto run = [&](int64_t nb0, int64_t nb1) {
        if (wdtype == 0) g_ops.linear_f32(x, M, K, static_cast<const float*>(wp), N, b, y, nb0, nb1);
        else g_ops.linear_bf16(x, M, K, static_cast<const uint16_t*>(wp), N, b, y, nb0, nb1);
    };
    // Column blocks in contiguous ranges: which thread computes (m, n) never changes its arithmetic.
    const int64_t blocks = (N + g_ops.block_width() - 1) / g_ops.block_width();
    const int64_t parts = threads > 1 && blocks >= 16 ? threads : 1;
    if (parts == 1) { run(0, blocks); return 0; }
    std::vector<std::thread> pool;
    const int64_t step = (blocks + parts - 1) / parts;
    for (int64_t p = 1; p < parts && p * step < blocks; ++p)
        pool.emplace_back(run, p * step, std::min(blocks, (p + 1) * step));
    run(0, std::min(blocks, step));
    for (auto& t : pool) t.join();
    return 0;
}

API int rapid_rowops_rms_norm(int wdtype, const float* x, int64_t M, int64_t K, const void* w, float eps, float* y) {
    if ((wdtype != 0 && wdtype != 1) || M < 0 || K <= 0) return RAPID_ROWOPS_ERR_ARG;
    if (wdtype == 0) g_ops.rms_f32(x, M, K, static_cast<const float*>(w), eps, y);
    else g_ops.rms_bf16(x, M, K, static_cast<const uint16_t*>(w), eps, y);
    return 0;
}

API int rapid_rowops_rope(float* x, int64_t U, int64_t H, int64_t d, const float* cos, const float* sin) {
    if (U < 0 || H < 0 || d <= 0 || d % 2) return RAPID_ROWOPS_ERR_ARG;
    g_ops.rope(x, U, H, d, cos, sin);
    return 0;
}

API int rapid_rowops_silu_mul(const float* g, const float* u, int64_t M, int64_t N, float* y) {
    if (M < 0 || N < 0) return RAPID_ROWOPS_ERR_ARG;
    g_ops.silu_mul(g, u, M, N, y);
    return 0;
}

API int rapid_rowops_attention(int kvdtype, const float* q, float* out, int64_t U, int64_t H, int64_t KVH, int64_t d,
                               float scale, const int64_t* pk, const int64_t* pv, const int64_t* plen,
                               const int64_t* pstride, const void* nk, const void* nv, int64_t nstride,
                               const int64_t* aoff, const int64_t* aidx) {
    if ((kvdtype != 0 && kvdtype != 1) || U < 0 || KVH <= 0 || H % KVH || d <= 0) return RAPID_ROWOPS_ERR_ARG;
    for (int64_t u = 0; u < U; ++u)
        if (plen[u] < 0 || aoff[u + 1] < aoff[u] || plen[u] + aoff[u + 1] - aoff[u] < 1) return RAPID_ROWOPS_ERR_ARG;
    if (kvdtype == 0)
        g_ops.attn_f32(q, out, U, H, KVH, d, scale, pk, pv, plen, pstride, static_cast<const float*>(nk),
                       static_cast<const float*>(nv), nstride, aoff, aidx);
    else
        g_ops.attn_bf16(q, out, U, H, KVH, d, scale, pk, pv, plen, pstride, static_cast<const uint16_t*>(nk),
                        static_cast<const uint16_t*>(nv), nstride, aoff, aidx);
    return 0;
}
