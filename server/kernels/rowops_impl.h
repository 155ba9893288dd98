/*
 * Row-invariant kernels of the target forward, written once and compiled per ISA
 * (rowops_avx512bf16.cpp, rowops_avx512.cpp, rowops_avx2.cpp, rowops_generic.cpp include it with their own
 * flags; rowops.cpp dispatches once per process, never per call).
 *
 * Why a row's result cannot depend on anything but the row's own inputs
 * -----------------------------------------------------------------------
 * Every output value is computed by one fixed sequence of floating-point operations that is a
 * function of the problem's own sizes (K, head_dim, the row's key count) only:
 *
 *  - dot      (rms_norm, attention scores): VW lanes, lane l accumulates a[k]*b[k] for
 *             k = l, l+VW, ... in increasing k with one fused multiply-add each, then one fixed
 *             shuffle tree; K % VW leftovers are added after, in order.
 *  - linear   y[m,n] = acc(m,n) (+ b[n]): one accumulator per output, acc = fma(x[m,k], w[n,k],
 *             acc) for k = 0 .. K-1 in order (avx512bf16: one VDPBF16PS per k pair, pairs in
 *             order, x rounded to bf16 once). Weights are packed in VW-column blocks; a tile of
 *             R rows x CB blocks shares the loads of w and x between accumulators, but each
 *             accumulator's instruction sequence is the same in every tile shape, so M (rows),
 *             N tails, the tile a row lands in and the thread that owns a column block change
 *             which loads are shared, never the arithmetic of one (m, n).
 *  - rms_norm per row: ss = dot(x, x), y = w * (x * (1 / sqrt(ss / K + eps))).
 *  - rope     per element: x*cos - / + rot(x)*sin, two products and one add, unfused.
 *  - attention per (row, head): the row's keys are listed explicitly — its session prefix
 *             0..P-1, then its ancestors' new keys in depth order — exactly the keys, in the
 *             same order, that a one-token step after committing those ancestors sees. No
 *             padding key, no other row's key and no other session's key is ever read, so
 *             there are no masked zeros whose count could regroup a sum. Scores by the dot
 *             above, max, e_j = expf(s_j - max), Z = sum e_j in key order, out = (sum_j e_j v_j,
 *             vector over head_dim, key order) / Z.
 *  - silu_mul per element: g / (1 + expf(-g)) * u.
 *
 * The translation units are compiled with -ffp-contract=off and without -ffast-math, so the
 * compiler neither fuses a multiply and an add on its own nor reassociates a sum; every fused
 * multiply-add is an explicit intrinsic. Only linear is split across threads (by column block).
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// Every tile size its own function: a partial tile inlined into its caller was register-starved
// (measured: M = 3..7 rows at a third of the speed of M = 8). Not for the generic path.
#if defined(__AVX2__) || defined(__AVX512F__)
#define ROWOPS_TILE_FN __attribute__((noinline)) static
#else
#define ROWOPS_TILE_FN static
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#if defined(ROWOPS_AMX)
#define ROWOPS_DPBF16 1
namespace rowops_amx {
#elif defined(__AVX512BF16__)
#define ROWOPS_DPBF16 1
namespace rowops_avx512bf16 {
#else
namespace rowops_avx512 {
#endif
constexpr int VW = 16;
using vf = __m512;
static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vf vload(const uint16_t* p) {  // bf16 -> fp32: exact (the bits shifted up)
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline float vsum(vf v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    return _mm_cvtss_f32(s4);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
namespace rowops_avx2 {
constexpr int VW = 8;
using vf = __m256;
static inline vf vzero() { return _mm256_setzero_ps(); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vf vload(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline float vsum(vf v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    return _mm_cvtss_f32(s4);
}
#else
namespace rowops_generic {
constexpr int VW = 8;
struct vf { float v[VW]; };
static inline vf vzero() { vf r; for (int i = 0; i < VW; ++i) r.v[i] = 0.0f; return r; }
static inline float bf16f(uint16_t h) { uint32_t b = uint32_t(h) << 16; float f; std::memcpy(&f, &b, 4); return f; }
static inline vf vload(const float* p) { vf r; for (int i = 0; i < VW; ++i) r.v[i] = p[i]; return r; }
static inline vf vload(const uint16_t* p) { vf r; for (int i = 0; i < VW; ++i) r.v[i] = bf16f(p[i]); return r; }
static inline vf vfma(vf a, vf b, vf c) {  // unfused: a product rounded, then a sum rounded
    vf r; for (int i = 0; i < VW; ++i) { float t = a.v[i] * b.v[i]; r.v[i] = c.v[i] + t; } return r;
}
static inline vf vset1(float x) { vf r; for (int i = 0; i < VW; ++i) r.v[i] = x; return r; }
static inline void vstore(float* p, vf v) { for (int i = 0; i < VW; ++i) p[i] = v.v[i]; }
static inline float vsum(vf v) {  // the same pairwise tree as the SIMD paths
    float a = (v.v[0] + v.v[4]) , b = (v.v[1] + v.v[5]), c = (v.v[2] + v.v[6]), d = (v.v[3] + v.v[7]);
    float e = a + c, f = b + d;
    return e + f;
}
#endif

static inline float to_f(float x) { return x; }
static inline float to_f(uint16_t h) { uint32_t b = uint32_t(h) << 16; float f; std::memcpy(&f, &b, 4); return f; }

// dot(a[0:n], b[0:n]) in the fixed order of the file comment.
template <typename T>
static inline float dot(const float* a, const T* b, int64_t n) {
    vf acc = vzero();
    int64_t k = 0;
    for (; k + VW <= n; k += VW) acc = vfma(vload(a + k), vload(b + k), acc);
    float s = vsum(acc);
    for (; k < n; ++k) { float t = a[k] * to_f(b[k]); s = s + t; }
    return s;
}

// Software prefetch this many bytes ahead in each packed weight stream: one core streaming the
// weights from DRAM otherwise waits on memory while it computes (a 467 MB LM head at 8 rows took
// 28 ms, 18 ms at 1 row; with the prefetch 15 and 13 ms on Zen 5). It changes no arithmetic.
#ifndef ROWOPS_PREFETCH_BYTES
#define ROWOPS_PREFETCH_BYTES 4096
#endif

// ---- linear over packed weights -------------------------------------------------------------
// Packed layout (pack): column block nb holds columns nb*VW .. nb*VW+VW-1 (zero past N).
//   fma kernels:    wp[nb][k][VW]        (fp32 or bf16 elements), K as is
//   dpbf16 kernels: wp[nb][k/2][VW][2]   (bf16 pairs), K padded to even with zeros
// Output (m, n) is lane n % VW of accumulator (m, n / VW): acc = fma(x[m][k], w[n][k], acc) for
// k = 0, 1, ..., K-1 in order (dpbf16: one VDPBF16PS per k pair, pairs in order). A tile of R
// rows x CB blocks only shares the loads of w and x between accumulators.

template <typename W>
static void pack(const W* w, int64_t N, int64_t K, W* out) {
    const int64_t nbs = (N + VW - 1) / VW;
    for (int64_t n = 0; n < nbs * VW; ++n) {
        const int64_t nb = n / VW, l = n % VW;
        for (int64_t k = 0; k < K; ++k) out[(nb * K + k) * VW + l] = n < N ? w[n * K + k] : W(0);
    }
}

template <int R, int CB>
static inline void store_tile(vf (&acc)[R][CB], const float* b, float* y, int64_t ldy, int64_t N, int64_t nb0) {
    alignas(64) float tmp[VW];
    for (int r = 0; r < R; ++r)
        for (int cb = 0; cb < CB; ++cb) {
            const int64_t n0 = (nb0 + cb) * VW;
            vstore(tmp, acc[r][cb]);
            const int64_t valid = N - n0 < VW ? N - n0 : VW;
            for (int64_t l = 0; l < valid; ++l) y[r * ldy + n0 + l] = b ? tmp[l] + b[n0 + l] : tmp[l];
        }
}

template <typename W, int R, int CB>
ROWOPS_TILE_FN void fma_tile(const float* x, int64_t ldx, const W* wp, int64_t K, const float* b, float* y, int64_t ldy,
                     int64_t N, int64_t nb0) {
    vf acc[R][CB];
    for (int r = 0; r < R; ++r)
        for (int cb = 0; cb < CB; ++cb) acc[r][cb] = vzero();
    for (int64_t k = 0; k < K; ++k) {
        vf wv[CB];
#pragma GCC unroll 4
        for (int cb = 0; cb < CB; ++cb) {
            const W* wq = wp + ((nb0 + cb) * K + k) * VW;
            __builtin_prefetch(wq + ROWOPS_PREFETCH_BYTES / sizeof(W));
            wv[cb] = vload(wq);
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            vf xb = vset1(x[r * ldx + k]);
#pragma GCC unroll 4
            for (int cb = 0; cb < CB; ++cb) acc[r][cb] = vfma(xb, wv[cb], acc[r][cb]);
        }
    }
    store_tile<R, CB>(acc, b, y, ldy, N, nb0);
}

#ifndef ROWOPS_TILE_R  // rows x column blocks of accumulators: 24 of 32 zmm, 12 of 16 ymm
#if defined(__AVX512F__)
#define ROWOPS_TILE_R 8
#define ROWOPS_TILE_CB 3
#else
#define ROWOPS_TILE_R 4
#define ROWOPS_TILE_CB 3
#endif
#endif
constexpr int TILE_R = ROWOPS_TILE_R;
constexpr int TILE_CB = ROWOPS_TILE_CB;

// f(std::integral_constant<int, rem>) for a remainder 1 <= rem <= R (templates need constants).
template <int R, typename F>
static inline void with_const(int64_t rem, F&& f) {
    if constexpr (R > 0) {
        if (rem == R) f(std::integral_constant<int, R>{});
        else with_const<R - 1>(rem, f);
    }
}

// TILE_R + 1 … 1.5 TILE_R rows (9-12 on AVX-512) run as ONE tile of 2 column blocks, the same
// 24 accumulators as 8 x 3: the weights pass once instead of once per tile (LM head, Zen 5: 8 + 1
// rows cost 1.3x 8 rows; 12 rows as one tile 1.07x). One block of up to 24 rows was slower than
// two balanced tiles (broadcast-bound). Past 12 rows, balanced tiles of TILE_R x TILE_CB.
constexpr int WIDE2_R = TILE_R * TILE_CB / 2;

// f(std::integral_constant<int, cb>, nb) over column blocks [nb_begin, nb_end): steps of CBS, the
// tail (fewer than CBS blocks) in one step.
template <int CBS, typename F>
static inline void column_steps(int64_t nb_begin, int64_t nb_end, F&& f) {
    int64_t nb = nb_begin;
    for (; nb + CBS <= nb_end; nb += CBS) f(std::integral_constant<int, CBS>{}, nb);
    with_const<CBS - 1>(nb_end - nb, [&](auto c) { f(c, nb); });
}

// AVX2 only (16 ymm registers, tiles of at most 12 accumulators): 7-8 rows run as ONE tile of 8 rows
// x 1 block (8 accumulators, the weights pass once), and past 8 rows tiles of <= 6 rows x 2 blocks.
// Measured on a Zen 3 (1 core, the target's layer shapes streamed from DRAM, fp32 weights, two runs
// interleaved with the 4 x 3 build, time relative to M = 1): M = 7 1.28-1.36x (4 x 3: 1.54-1.70x),
// M = 8 1.38-1.44x (1.48-1.62x), M = 12 1.84-1.92x (1.98-1.99x), M = 16 2.35-2.44x (2.44-2.46x).
// Up to 6 rows the tiles above are already one pass. 8 x 1 for every M is slow at 1-6 rows (too few
// accumulators to hide the FMA latency).
#if defined(__AVX512F__)
constexpr int ONE_BLOCK_R = 0;  // no single-block tile
constexpr int MANY_R = TILE_R, MANY_CB = TILE_CB;
#else
constexpr int ONE_BLOCK_R = 2 * TILE_R;
constexpr int MANY_R = WIDE2_R, MANY_CB = 2;
#endif

// f(cb, rmax, nb) for the tile shape M rows take (above): column steps of cb blocks, at most
// rmax rows per tile (both std::integral_constant).
template <typename F>
static inline void by_shape(int64_t M, int64_t nb_begin, int64_t nb_end, F&& f) {
    using std::integral_constant;
    if (M <= TILE_R)
        column_steps<TILE_CB>(nb_begin, nb_end, [&](auto c, int64_t nb) { f(c, integral_constant<int, TILE_R>{}, nb); });
    else if (M <= WIDE2_R)
        column_steps<2>(nb_begin, nb_end, [&](auto c, int64_t nb) { f(c, integral_constant<int, WIDE2_R>{}, nb); });
    else if (M <= ONE_BLOCK_R) {  // never on AVX-512 (0), where the branch is not even instantiated
        if constexpr (ONE_BLOCK_R > 0)
            column_steps<1>(nb_begin, nb_end, [&](auto c, int64_t nb) { f(c, integral_constant<int, ONE_BLOCK_R>{}, nb); });
    } else
        column_steps<MANY_CB>(nb_begin, nb_end, [&](auto c, int64_t nb) { f(c, integral_constant<int, MANY_R>{}, nb); });
}

// Rows in ceil(M / RMAX) tiles whose sizes differ by at most one (17 rows: 5 + 6 + 6, not
// 8 + 8 + 1): a 1-row tile has CB accumulators, too few to hide the multiply-add latency, and
// costs about as much as a full tile. Tile shapes never change an output's arithmetic.
template <int RMAX, typename F>
static inline void balanced_tiles(int64_t M, F&& tile) {
    const int64_t tiles = (M + RMAX - 1) / RMAX;
    int64_t m = 0;
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t rows = (M - m) / (tiles - t);
        tile(m, rows);
        m += rows;
    }
}

template <typename W, int CB, int RMAX>
static void fma_rows(const float* x, int64_t M, int64_t K, const W* wp, const float* b, float* y, int64_t N,
                     int64_t nb0) {
    balanced_tiles<RMAX>(M, [&](int64_t m, int64_t rows) {
        with_const<RMAX>(rows, [&](auto r) {
            fma_tile<W, decltype(r)::value, CB>(x + m * K, K, wp, K, b, y + m * N, N, N, nb0);
        });
    });
}

// y[M, N] columns of blocks [nb_begin, nb_end) = x[M, K] w^T (+ b), w packed by pack().
template <typename W>
static void linear_fma(const float* x, int64_t M, int64_t K, const W* wp, int64_t N, const float* b, float* y,
                       int64_t nb_begin, int64_t nb_end) {
    by_shape(M, nb_begin, nb_end, [&](auto c, auto rmax, int64_t nb) {
        fma_rows<W, decltype(c)::value, decltype(rmax)::value>(x, M, K, wp, b, y, N, nb);
    });
}

#if defined(ROWOPS_DPBF16)
// bf16 weights with VDPBF16PS: x rounded to bf16 (round to nearest even) once per row.
static void pack_dp(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
    const int64_t nbs = (N + VW - 1) / VW, kp = (K + 1) / 2;
    for (int64_t n = 0; n < nbs * VW; ++n) {
        const int64_t nb = n / VW, l = n % VW;
        for (int64_t k = 0; k < 2 * kp; ++k)
            out[((nb * kp + k / 2) * VW + l) * 2 + k % 2] = n < N && k < K ? w[n * K + k] : uint16_t(0);
    }
}

template <int R, int CB>
ROWOPS_TILE_FN void dp_tile(const uint16_t* xb, int64_t ldx, const uint16_t* wp, int64_t kp, const float* b, float* y,
                    int64_t ldy, int64_t N, int64_t nb0) {
    vf acc[R][CB];
    for (int r = 0; r < R; ++r)
        for (int cb = 0; cb < CB; ++cb) acc[r][cb] = vzero();
    for (int64_t p = 0; p < kp; ++p) {
        __m512i wv[CB];
#pragma GCC unroll 4
        for (int cb = 0; cb < CB; ++cb) {
            const uint16_t* wq = wp + ((nb0 + cb) * kp + p) * VW * 2;
            __builtin_prefetch(wq + ROWOPS_PREFETCH_BYTES / sizeof(uint16_t));
            wv[cb] = _mm512_loadu_si512(reinterpret_cast<const void*>(wq));
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            std::memcpy(&pair, xb + r * ldx + 2 * p, 4);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
            for (int cb = 0; cb < CB; ++cb) acc[r][cb] = _mm512_dpbf16_ps(acc[r][cb], xv, (__m512bh)wv[cb]);
        }
    }
    store_tile<R, CB>(acc, b, y, ldy, N, nb0);
}

static inline uint16_t bf16_rne(float f) {  // what VCVTNEPS2BF16 does for finite values
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return uint16_t((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

template <int CB, int RMAX>
static void dp_rows(const uint16_t* xb, int64_t M, int64_t kp, const uint16_t* wp, const float* b, float* y,
                    int64_t N, int64_t nb0) {
    const int64_t ldx = 2 * kp;
    balanced_tiles<RMAX>(M, [&](int64_t m, int64_t rows) {
        with_const<RMAX>(rows, [&](auto r) {
            dp_tile<decltype(r)::value, CB>(xb + m * ldx, ldx, wp, kp, b, y + m * N, N, N, nb0);
        });
    });
}

// x [M, K] rounded to bf16 once, rows of ldx >= K elements, zero-padded to ``rows`` >= M rows.
static std::vector<uint16_t> rows_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, int64_t rows) {
    std::vector<uint16_t> xb(size_t(rows * ldx), 0);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) xb[m * ldx + k] = bf16_rne(x[m * K + k]);
    return xb;
}

static void linear_dp(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* b, float* y,
                      int64_t nb_begin, int64_t nb_end) {
    const int64_t kp = (K + 1) / 2;
    const std::vector<uint16_t> xb = rows_bf16(x, M, K, 2 * kp, M);
    by_shape(M, nb_begin, nb_end, [&](auto c, auto rmax, int64_t nb) {
        dp_rows<decltype(c)::value, decltype(rmax)::value>(xb.data(), M, kp, wp, b, y, N, nb);
    });
}

static int64_t packed_size_bf16(int64_t N, int64_t K) { return (N + VW - 1) / VW * VW * ((K + 1) / 2) * 2; }
static void pack_bf16(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) { pack_dp(w, N, K, out); }
#if defined(ROWOPS_AMX)
// AMX (TDPBF16PS): C[m][n] += sum over the 16 k pairs of one tile of x[m][2k..2k+1] . w[n][2k..2k+1],
// tiles in increasing k. Intel defines every element of C by that sum over k alone (SDM, TDPBF16PS
// pseudocode: a loop over the rows m of the destination, each row from row m of A and all of B), so
// no other row can enter it: rows are padded to 16 with zeros and the same tile shape serves every
// M. The packed weights are pack_dp's layout: for one block of 16 columns, 16 consecutive k pairs
// are 16 rows of 64 bytes, one B tile. x is rounded to bf16 once (bf16_rne), as on avx512bf16.
// K a multiple of 32 only (every linear of the supported targets); else the VDPBF16PS path, chosen
// by K alone, so one linear runs one arithmetic whatever M is.
struct alignas(64) AmxConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

static void amx_configure() {  // every tile 16 rows x 64 bytes: C 16 x 16 fp32, A 16 x 32 bf16, B 16 pairs x 16
    AmxConfig c;
    for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

// y = C (+ b) for the valid rows and columns of a stored C tile.
static inline void amx_store(const float (&c)[16][16], const float* b, float* y, int64_t rows, int64_t N, int64_t n0) {
    const int64_t valid = N - n0 < VW ? N - n0 : VW;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t l = 0; l < valid; ++l) y[r * N + n0 + l] = b ? c[r][l] + b[n0 + l] : c[r][l];
}

// The B tile AMX_AHEAD tiles further along a column block's stream (1 KB each, contiguous): 1-3 ran
// alike on the Xeon with AMX (M = 1: 18 GB/s, the VDPBF16PS kernel's speed), 4 and past it slower.
#ifndef AMX_AHEAD
#define AMX_AHEAD 2
#endif
static inline void amx_prefetch(const uint16_t* tile) {
    const char* p = reinterpret_cast<const char*>(tile) + AMX_AHEAD * 1024;
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

// Up to 16 rows x CB (1 or 4) column blocks: tmm0-3 = C, tmm4 = A, tmm5/tmm6 = B.
template <int CB>
static void amx_rows16(const uint16_t* xb, int64_t kp, const uint16_t* wp, const float* b, float* y, int64_t rows,
                       int64_t N, int64_t nb0) {
    _tile_zero(0);
    if constexpr (CB == 4) { _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    const int64_t lda = 4 * kp;  // bytes per row of xb
    for (int64_t p = 0; p < kp; p += 16) {
        _tile_loadd(4, xb + 2 * p, lda);
        amx_prefetch(wp + ((nb0 + 0) * kp + p) * VW * 2);
        _tile_loadd(5, wp + ((nb0 + 0) * kp + p) * VW * 2, 64);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (CB == 4) {
            amx_prefetch(wp + ((nb0 + 1) * kp + p) * VW * 2);
            amx_prefetch(wp + ((nb0 + 2) * kp + p) * VW * 2);
            amx_prefetch(wp + ((nb0 + 3) * kp + p) * VW * 2);
            _tile_loadd(6, wp + ((nb0 + 1) * kp + p) * VW * 2, 64);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, wp + ((nb0 + 2) * kp + p) * VW * 2, 64);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(6, wp + ((nb0 + 3) * kp + p) * VW * 2, 64);
            _tile_dpbf16ps(3, 4, 6);
        }
    }
    alignas(64) float c[4][16][16];
    _tile_stored(0, c[0], 64);
    if constexpr (CB == 4) { _tile_stored(1, c[1], 64); _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64); }
    for (int cb = 0; cb < CB; ++cb) amx_store(c[cb], b, y, rows, N, (nb0 + cb) * VW);
}

// 17-32 rows (two A tiles) x CB (1 or 2) column blocks, so the weights pass once for up to 32
// rows: tmm0-3 = C (row group g, block cb at 2g + cb), tmm4/tmm5 = A, tmm6/tmm7 = B.
template <int CB>
static void amx_rows32(const uint16_t* xb, int64_t kp, const uint16_t* wp, const float* b, float* y, int64_t rows,
                       int64_t N, int64_t nb0) {
    _tile_zero(0); _tile_zero(2);
    if constexpr (CB == 2) { _tile_zero(1); _tile_zero(3); }
    const int64_t lda = 4 * kp;
    for (int64_t p = 0; p < kp; p += 16) {
        _tile_loadd(4, xb + 2 * p, lda);
        _tile_loadd(5, xb + 16 * 2 * kp + 2 * p, lda);
        amx_prefetch(wp + ((nb0 + 0) * kp + p) * VW * 2);
        _tile_loadd(6, wp + ((nb0 + 0) * kp + p) * VW * 2, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (CB == 2) {
            amx_prefetch(wp + ((nb0 + 1) * kp + p) * VW * 2);
            _tile_loadd(7, wp + ((nb0 + 1) * kp + p) * VW * 2, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    alignas(64) float c[4][16][16];
    _tile_stored(0, c[0], 64); _tile_stored(2, c[2], 64);
    if constexpr (CB == 2) { _tile_stored(1, c[1], 64); _tile_stored(3, c[3], 64); }
    for (int cb = 0; cb < CB; ++cb) {
        amx_store(c[cb], b, y, 16, N, (nb0 + cb) * VW);
        amx_store(c[2 + cb], b, y + 16 * N, rows - 16, N, (nb0 + cb) * VW);
    }
}

static void linear_amx(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* b, float* y,
                       int64_t nb_begin, int64_t nb_end) {
    const int64_t kp = K / 2, chunks = (M + 31) / 32;
    const std::vector<uint16_t> xb = rows_bf16(x, M, K, K, chunks * 32);  // zero rows up to whole tiles
    amx_configure();
    for (int64_t g = 0; g < chunks; ++g) {  // 32 rows at a time; a chunk of <= 16 rows uses one A tile
        const uint16_t* xg = xb.data() + g * 32 * K;
        const int64_t rows = M - 32 * g < 32 ? M - 32 * g : 32;
        float* yg = y + g * 32 * N;
        int64_t nb = nb_begin;
        if (rows <= 16) {
            for (; nb + 4 <= nb_end; nb += 4) amx_rows16<4>(xg, kp, wp, b, yg, rows, N, nb);
            for (; nb < nb_end; ++nb) amx_rows16<1>(xg, kp, wp, b, yg, rows, N, nb);
        } else {
            for (; nb + 2 <= nb_end; nb += 2) amx_rows32<2>(xg, kp, wp, b, yg, rows, N, nb);
            for (; nb < nb_end; ++nb) amx_rows32<1>(xg, kp, wp, b, yg, rows, N, nb);
        }
    }
    _tile_release();
}

static void linear_bf16(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* b, float* y,
                        int64_t nb0, int64_t nb1) {
    if (K % 32 == 0) linear_amx(x, M, K, wp, N, b, y, nb0, nb1);
    else linear_dp(x, M, K, wp, N, b, y, nb0, nb1);
}
#else
static void linear_bf16(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* b, float* y,
                        int64_t nb0, int64_t nb1) { linear_dp(x, M, K, wp, N, b, y, nb0, nb1); }
#endif
#else
static int64_t packed_size_bf16(int64_t N, int64_t K) { return (N + VW - 1) / VW * VW * K; }
static void pack_bf16(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) { pack<uint16_t>(w, N, K, out); }
static void linear_bf16(const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, const float* b, float* y,
                        int64_t nb0, int64_t nb1) { linear_fma<uint16_t>(x, M, K, wp, N, b, y, nb0, nb1); }
#endif
static int64_t packed_size_f32(int64_t N, int64_t K) { return (N + VW - 1) / VW * VW * K; }
static void pack_f32(const float* w, int64_t N, int64_t K, float* out) { pack<float>(w, N, K, out); }
static void linear_f32(const float* x, int64_t M, int64_t K, const float* wp, int64_t N, const float* b, float* y,
                       int64_t nb0, int64_t nb1) { linear_fma<float>(x, M, K, wp, N, b, y, nb0, nb1); }
static int64_t block_width() { return VW; }

// y[m] = w * (x[m] * (1 / sqrt(dot(x[m], x[m]) / K + eps))) for rows [0, M).
template <typename W>
static void rms_norm(const float* x, int64_t M, int64_t K, const W* w, float eps, float* y) {
    for (int64_t m = 0; m < M; ++m) {
        const float* xr = x + m * K;
        float ss = dot(xr, xr, K);
        float inv = 1.0f / std::sqrt(ss / float(K) + eps);
        for (int64_t k = 0; k < K; ++k) { float h = xr[k] * inv; y[m * K + k] = to_f(w[k]) * h; }
    }
}

// HF rotate_half rope in place on x[U, H, d] with cos/sin [U, d] (fp32).
static void rope(float* x, int64_t U, int64_t H, int64_t d, const float* cos, const float* sin) {
    const int64_t half = d / 2;
    std::vector<float> rot(d);
    for (int64_t u = 0; u < U; ++u)
        for (int64_t h = 0; h < H; ++h) {
            float* v = x + (u * H + h) * d;
            const float* c = cos + u * d;
            const float* s = sin + u * d;
            for (int64_t i = 0; i < half; ++i) { rot[i] = -v[half + i]; rot[half + i] = v[i]; }
            for (int64_t i = 0; i < d; ++i) { float a = v[i] * c[i]; float b = rot[i] * s[i]; v[i] = a + b; }
        }
}

// y = silu(g) * u elementwise over rows [0, M) of width N.
static void silu_mul(const float* g, const float* u, int64_t M, int64_t N, float* y) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < N; ++i) {
            float gv = g[m * N + i];
            float sg = gv / (1.0f + std::exp(-gv));
            y[m * N + i] = sg * u[m * N + i];
        }
}

// Attention of rows [0, U) (see the file comment). q/out [U, H, d] fp32; a row u sees
// prefix keys 0..plen[u]-1 of its session (head g at pk[u] + g*pstride[u] + j*d) then the new
// keys nk + g*nstride + aidx[a]*d for a in [aoff[u], aoff[u+1]).
template <typename T>
static void attention(const float* q, float* out, int64_t U, int64_t H, int64_t KVH, int64_t d, float scale,
                      const int64_t* pk, const int64_t* pv, const int64_t* plen, const int64_t* pstride,
                      const T* nk, const T* nv, int64_t nstride, const int64_t* aoff, const int64_t* aidx) {
    const int64_t group = H / KVH;
    std::vector<float> s;
    std::vector<float> acc(d);
    for (int64_t u = 0; u < U; ++u) {
        const int64_t P = plen[u], A = aoff[u + 1] - aoff[u];
        s.resize(size_t(P + A));
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / group;
            const float* qv = q + (u * H + h) * d;
            const T* kp = reinterpret_cast<const T*>(pk[u]) + g * pstride[u];
            const T* vp = reinterpret_cast<const T*>(pv[u]) + g * pstride[u];
            const T* kn = nk + g * nstride;
            const T* vn = nv + g * nstride;
            for (int64_t j = 0; j < P; ++j) s[j] = dot(qv, kp + j * d, d) * scale;
            for (int64_t a = 0; a < A; ++a) s[P + a] = dot(qv, kn + aidx[aoff[u] + a] * d, d) * scale;
            float mx = s[0];
            for (int64_t j = 1; j < P + A; ++j) mx = s[j] > mx ? s[j] : mx;
            float z = 0.0f;
            for (int64_t j = 0; j < P + A; ++j) { s[j] = std::exp(s[j] - mx); z = z + s[j]; }
            int64_t i0 = 0;
            for (; i0 + VW <= d; i0 += VW) {
                vf o = vzero();
                for (int64_t j = 0; j < P; ++j) o = vfma(vset1(s[j]), vload(vp + j * d + i0), o);
                for (int64_t a = 0; a < A; ++a) o = vfma(vset1(s[P + a]), vload(vn + aidx[aoff[u] + a] * d + i0), o);
                vstore(acc.data() + i0, o);
            }
            for (int64_t i = i0; i < d; ++i) {
                float o = 0.0f;
                for (int64_t j = 0; j < P; ++j) { float t = s[j] * to_f(vp[j * d + i]); o = o + t; }
                for (int64_t a = 0; a < A; ++a) { float t = s[P + a] * to_f(vn[aidx[aoff[u] + a] * d + i]); o = o + t; }
                acc[i] = o;
            }
            float* ov = out + (u * H + h) * d;
            for (int64_t i = 0; i < d; ++i) ov[i] = acc[i] / z;
        }
    }
}

}  // namespace
