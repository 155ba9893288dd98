/*
 * RAPID row-invariant target kernels (librapid_rowops): every output row of a forward is a
 * function of that row's own inputs only, whatever the number of rows, chains, sessions or
 * threads (see rowops_impl.h for the construction).
 *
 * Tensors are C-contiguous fp32 unless named otherwise; weights are [N, K] (PyTorch's
 * nn.Linear layout) in fp32 (wdtype 0) or bf16 bits (wdtype 1); KV entries likewise.
 * The ISA is chosen once (AMX tiles, AVX-512 with BF16 dot products, AVX-512F, AVX2+FMA, generic C++; $RAPID_ROW_ISA or
 * rapid_rowops_select to force one); each ISA is a separate, self-consistent arithmetic.
 * Every entry point returns 0, or RAPID_ROWOPS_ERR_ARG for a bad argument (nothing written).
 */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RAPID_ROWOPS_ABI_VERSION 1
#define RAPID_ROWOPS_ERR_ARG -1

int rapid_rowops_abi_version(void);
const char* rapid_rowops_isa(void);        /* the ISA in use: "avx512bf16", "avx512", "avx2" or "generic" */
const char* rapid_rowops_available(void);  /* those this CPU runs, comma separated (built once, never changes) */
int rapid_rowops_select(const char* isa);  /* 0, or -1 when this CPU cannot run it; not while a kernel runs */

/* Weights [N, K] in the ISA's packed layout (rowops_impl.h): elements of `out`, and the packing. */
int64_t rapid_rowops_packed_size(int wdtype, int64_t N, int64_t K);
int rapid_rowops_pack(int wdtype, const void* w, int64_t N, int64_t K, void* out);
/* y[M, N] = x[M, K] w^T (+ b[N]), w packed by rapid_rowops_pack under the same ISA; column
 * blocks split over `threads` (1 = the caller only). */
int rapid_rowops_linear(int wdtype, const float* x, int64_t M, int64_t K, const void* wp, int64_t N,
                        const float* b, float* y, int threads);
int rapid_rowops_rms_norm(int wdtype, const float* x, int64_t M, int64_t K, const void* w, float eps, float* y);
int rapid_rowops_rope(float* x, int64_t U, int64_t H, int64_t d, const float* cos, const float* sin);
int rapid_rowops_silu_mul(const float* g, const float* u, int64_t M, int64_t N, float* y);
/* q/out [U, H, d]; row u: prefix keys j < plen[u] at pk[u] + (g*pstride[u] + j*d) elements,
 * then new keys nk + (g*nstride + aidx[a]*d) for a in [aoff[u], aoff[u+1]); g = h / (H/KVH). */
int rapid_rowops_attention(int kvdtype, const float* q, float* out, int64_t U, int64_t H, int64_t KVH, int64_t d,
                           float scale, const int64_t* pk, const int64_t* pv, const int64_t* plen,
                           const int64_t* pstride, const void* nk, const void* nv, int64_t nstride,
                           const int64_t* aoff, const int64_t* aidx);

#ifdef __cplusplus
}
#endif
