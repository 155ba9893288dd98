// Host planner and kernel bodies of the CUDA KV kernels, written once and
// compiled twice:
//   * kvops_cuda.cu      wraps the bodies in __global__ kernels (real GPU);
//   * kvops_cuda_emu.cpp runs the very same bodies serially on the host, so the
//     planner, chunking and index arithmetic are tested on machines without a
//     GPU (librapid_kvops_cuda_emu, a test-only library).
// Semantics and the race-freedom argument are documented in kvops.h.
#ifndef RAPID_KVOPS_CUDA_IMPL_H
#define RAPID_KVOPS_CUDA_IMPL_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <utility>
#include <vector>

#include "kvops.h"
#include "kvops_common.h"

#if defined(__CUDACC__)
#  define RKV_HD __host__ __device__ __forceinline__
#else
#  define RKV_HD inline
#endif

namespace rapid_kv {

// Copy words: the kernels move raw bytes, in the widest word that divides the
// row size and the buffer alignment.
#if defined(__CUDACC__)
using W16 = uint4;
using W8 = uint2;
#else
struct alignas(16) W16 { uint32_t v[4]; };
struct alignas(8) W8 { uint32_t v[2]; };
#endif
using W4 = uint32_t;
using W2 = uint16_t;
using W1 = uint8_t;

constexpr int kChunk = RAPID_KV_CUDA_CHUNK;  // moves per kernel launch
constexpr int kSnapshotDepth = 8;            // rows a SNAPSHOT thread holds in registers

// Passed to the kernels by value (kernel parameter space, well under the 4 KiB
// limit of older CUDA releases / JetPack 5), so a launch needs no device
// allocation and no host->device copy.
struct GatherParams {
  void* buf;
  int64_t cap;    // rows per plane
  int64_t words;  // words per row
  int32_t n;      // moves in this launch
  int32_t src[kChunk];
  int32_t dst[kChunk];
};
static_assert(sizeof(GatherParams) + 16 <= 4000, "kernel parameters must stay below 4 KiB");

enum class Mode { kParallel, kSnapshot, kSequential };

// PARALLEL: one thread per (o, i, w), w fastest (coalesced). Only used when no
// row is both read and written and dst has no duplicates, so threads touch
// disjoint memory for writes and nobody writes what anybody reads.
template <class W>
RKV_HD void gather_parallel_body(const GatherParams& p, int64_t tid) {
  const int64_t w = tid % p.words;
  const int64_t rest = tid / p.words;
  const int64_t i = rest % p.n;
  const int64_t o = rest / p.n;
  W* b = static_cast<W*>(p.buf) + o * p.cap * p.words + w;
  b[static_cast<int64_t>(p.dst[i]) * p.words] = b[static_cast<int64_t>(p.src[i]) * p.words];
}

// SNAPSHOT / SEQUENTIAL: one thread per (o, w) column performing every move of
// the launch in order. A column is owned by exactly one thread, so there is no
// race. SNAPSHOT loads kSnapshotDepth rows before storing them (independent
// loads overlap their latency); it is only used when no src[i] equals an
// earlier dst[j], where that equals the sequential order.
template <class W, bool kSnapshot>
RKV_HD void gather_column_body(const GatherParams& p, int64_t tid) {
  const int64_t w = tid % p.words;
  const int64_t o = tid / p.words;
  W* b = static_cast<W*>(p.buf) + o * p.cap * p.words + w;
  const int64_t words = p.words;
  int i = 0;
  if (kSnapshot) {
    for (; i + kSnapshotDepth <= p.n; i += kSnapshotDepth) {
      W tmp[kSnapshotDepth];
#if defined(__CUDACC__)
#  pragma unroll
#endif
      for (int k = 0; k < kSnapshotDepth; ++k) {
        tmp[k] = b[static_cast<int64_t>(p.src[i + k]) * words];
      }
#if defined(__CUDACC__)
#  pragma unroll
#endif
      for (int k = 0; k < kSnapshotDepth; ++k) {
        b[static_cast<int64_t>(p.dst[i + k]) * words] = tmp[k];
      }
    }
  }
  // The rest (everything for SEQUENTIAL, the tail for SNAPSHOT) in order.
  for (; i < p.n; ++i) {
    b[static_cast<int64_t>(p.dst[i]) * words] = b[static_cast<int64_t>(p.src[i]) * words];
  }
}

// ---------------------------------------------------------------- planner --

struct Plan {
  Mode mode = Mode::kSequential;
  std::vector<int32_t> src, dst;  // no-op moves (src == dst) removed
};

// Indices must already be validated against cap (<= INT32_MAX).
inline void make_plan(const int64_t* src, const int64_t* dst, int64_t n, Plan* plan) {
  plan->src.clear();
  plan->dst.clear();
  plan->src.reserve(static_cast<size_t>(n));
  plan->dst.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] == dst[i]) continue;  // a no-op in sequential order, too
    plan->src.push_back(static_cast<int32_t>(src[i]));
    plan->dst.push_back(static_cast<int32_t>(dst[i]));
  }
  const size_t m = plan->src.size();
  // (row, move index) of every write, sorted: the first entry of a row is its
  // first write.
  std::vector<std::pair<int32_t, int32_t>> writes(m);
  for (size_t i = 0; i < m; ++i) writes[i] = {plan->dst[i], static_cast<int32_t>(i)};
  std::sort(writes.begin(), writes.end());
  bool unique_dst = true;
  for (size_t i = 1; i < m; ++i) {
    if (writes[i].first == writes[i - 1].first) unique_dst = false;
  }
  bool read_written = false;  // some row is both read and written
  bool hazard = false;        // some move reads a row an earlier move wrote
  for (size_t i = 0; i < m; ++i) {
    const auto it = std::lower_bound(writes.begin(), writes.end(),
                                     std::make_pair(plan->src[i], static_cast<int32_t>(-1)));
    if (it != writes.end() && it->first == plan->src[i]) {
      read_written = true;
      if (static_cast<size_t>(it->second) < i) hazard = true;
    }
  }
  if (unique_dst && !read_written) {
    plan->mode = Mode::kParallel;
  } else if (!hazard) {
    plan->mode = Mode::kSnapshot;
  } else {
    plan->mode = Mode::kSequential;
  }
}

inline int pick_word(uintptr_t addr, int64_t row_bytes) {
  for (int w : {16, 8, 4, 2}) {
    if (row_bytes % w == 0 && addr % static_cast<uintptr_t>(w) == 0) return w;
  }
  return 1;
}

// Backend interface (see kvops_cuda.cu / kvops_cuda_emu.cpp):
//   template <class W> int parallel(const GatherParams&, int64_t threads, void* stream);
//   template <class W, bool S> int column(const GatherParams&, int64_t threads, void* stream);
//   int memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch,
//                size_t width, size_t height, void* stream);
template <class B, class W>
int run_plan(B& be, void* buf, int64_t outer, int64_t cap, int64_t words, const Plan& plan,
             void* stream) {
  GatherParams p;
  p.buf = buf;
  p.cap = cap;
  p.words = words;
  const int64_t n = static_cast<int64_t>(plan.src.size());
  for (int64_t off = 0; off < n; off += kChunk) {
    p.n = static_cast<int32_t>(std::min<int64_t>(kChunk, n - off));
    std::memcpy(p.src, plan.src.data() + off, sizeof(int32_t) * static_cast<size_t>(p.n));
    std::memcpy(p.dst, plan.dst.data() + off, sizeof(int32_t) * static_cast<size_t>(p.n));
    int rc = RAPID_KV_OK;
    switch (plan.mode) {
      case Mode::kParallel:
        rc = be.template parallel<W>(p, outer * p.n * words, stream);
        break;
      case Mode::kSnapshot:
        rc = be.template column<W, true>(p, outer * words, stream);
        break;
      case Mode::kSequential:
        rc = be.template column<W, false>(p, outer * words, stream);
        break;
    }
    if (rc != RAPID_KV_OK) return rc;
  }
  return RAPID_KV_OK;
}

template <class B>
int run_plan_any(B& be, void* buf, int64_t outer, int64_t cap, int64_t row_bytes,
                 const Plan& plan, void* stream) {
  if (plan.src.empty()) return RAPID_KV_OK;
  const int wb = pick_word(reinterpret_cast<uintptr_t>(buf), row_bytes);
  const int64_t words = row_bytes / wb;
  switch (wb) {
    case 16: return run_plan<B, W16>(be, buf, outer, cap, words, plan, stream);
    case 8: return run_plan<B, W8>(be, buf, outer, cap, words, plan, stream);
    case 4: return run_plan<B, W4>(be, buf, outer, cap, words, plan, stream);
    case 2: return run_plan<B, W2>(be, buf, outer, cap, words, plan, stream);
    default: return run_plan<B, W1>(be, buf, outer, cap, words, plan, stream);
  }
}

template <class B>
int gather_entry(B& be, void* buf, int64_t outer, int64_t cap, int64_t inner, int64_t elem,
                 const int64_t* src, const int64_t* dst, int64_t n, void* stream) {
  int64_t rb = 0;
  const int rc = check_gather(buf, outer, cap, inner, elem, src, dst, n, &rb);
  if (rc != RAPID_KV_OK) return rc < 0 ? rc : RAPID_KV_OK;
  if (cap > INT32_MAX) return RAPID_KV_ERR_ARG;
  try {
    Plan plan;
    make_plan(src, dst, n, &plan);
    return run_plan_any(be, buf, outer, cap, rb, plan, stream);
  } catch (const std::bad_alloc&) {
    return RAPID_KV_ERR_NOMEM;
  }
}

template <class B>
int copy_range_entry(B& be, const void* sb, void* db, int64_t outer, int64_t scap, int64_t dcap,
                     int64_t inner, int64_t elem, int64_t ss, int64_t ds, int64_t len,
                     void* stream) {
  int64_t rb = 0;
  bool same = false;
  const int rc = check_copy_range(sb, db, outer, scap, dcap, inner, elem, ss, ds, len, &rb, &same);
  if (rc != RAPID_KV_OK) return rc < 0 ? rc : RAPID_KV_OK;
  const int64_t gap = ss > ds ? ss - ds : ds - ss;
  if (same && gap < len) {
    // Overlapping ranges in one buffer: cudaMemcpy* leaves overlap undefined,
    // so run it as a gather in the order that never reads a row after
    // overwriting it (ascending when moving down, descending when moving up).
    if (scap > INT32_MAX) return RAPID_KV_ERR_ARG;
    try {
      std::vector<int64_t> s(static_cast<size_t>(len)), d(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) {
        const int64_t k = ds < ss ? i : len - 1 - i;
        s[static_cast<size_t>(i)] = ss + k;
        d[static_cast<size_t>(i)] = ds + k;
      }
      Plan plan;
      make_plan(s.data(), d.data(), len, &plan);
      return run_plan_any(be, db, outer, scap, rb, plan, stream);
    } catch (const std::bad_alloc&) {
      return RAPID_KV_ERR_NOMEM;
    }
  }
  const size_t row = static_cast<size_t>(rb);
  return be.memcpy2d(static_cast<char*>(db) + static_cast<size_t>(ds) * row,
                     static_cast<size_t>(dcap) * row,
                     static_cast<const char*>(sb) + static_cast<size_t>(ss) * row,
                     static_cast<size_t>(scap) * row, static_cast<size_t>(len) * row,
                     static_cast<size_t>(outer), stream);
}

}  // namespace rapid_kv

// Defines the exported CUDA ABI of kvops.h on top of a backend object `BE`.
#define RAPID_KV_DEFINE_CUDA_ABI_T(SUFFIX, BYTES, BE)                                         \
  RAPID_KV_API int rapid_kv_gather_cuda_##SUFFIX(void* buf, int64_t outer, int64_t seq_cap,  \
                                                 int64_t inner, const int64_t* src,          \
                                                 const int64_t* dst, int64_t n,              \
                                                 void* stream) {                             \
    return rapid_kv::gather_entry(BE, buf, outer, seq_cap, inner, BYTES, src, dst, n,        \
                                  stream);                                                   \
  }                                                                                          \
  RAPID_KV_API int rapid_kv_copy_range_cuda_##SUFFIX(                                        \
      const void* src_buf, void* dst_buf, int64_t outer, int64_t src_cap, int64_t dst_cap,   \
      int64_t inner, int64_t src_start, int64_t dst_start, int64_t len, void* stream) {      \
    return rapid_kv::copy_range_entry(BE, src_buf, dst_buf, outer, src_cap, dst_cap, inner,  \
                                      BYTES, src_start, dst_start, len, stream);             \
  }

#define RAPID_KV_DEFINE_CUDA_ABI(BE)          \
  RAPID_KV_DEFINE_CUDA_ABI_T(f16, 2, BE)      \
  RAPID_KV_DEFINE_CUDA_ABI_T(f32, 4, BE)      \
  RAPID_KV_DEFINE_CUDA_ABI_T(f64, 8, BE)

#endif  // RAPID_KVOPS_CUDA_IMPL_H
