// CPU kernels of librapid_kvops; semantics are documented in kvops.h.
//
// The kernels are single-threaded: one compaction moves a few rows per
// (layer, head) plane, far too little work to amortise a thread pool.
#include <cstring>
#include <new>
#include <vector>

#include "kvops.h"
#include "kvops_common.h"

namespace {

using rapid_kv::check_copy_range;
using rapid_kv::check_gather;

struct Run {
  int64_t s, d, len;  // rows [s, s+len) -> [d, d+len)
};

// Coalesce the move list into runs that one memmove per plane may execute.
// Extending run (s0, d0, L) by the move (s0+L -> d0+L) is only allowed when a
// single memmove of L+1 rows equals the L+1 sequential row moves: either
// d0 < s0 (a downward shift never reads a row it wrote earlier) or the two
// ranges are disjoint (d0 >= s0 + L + 1). No-op moves (s == d) are dropped.
int64_t make_runs(const int64_t* src, const int64_t* dst, int64_t n, Run* runs) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src[i], d = dst[i];
    if (s == d) continue;
    if (k > 0) {
      Run& r = runs[k - 1];
      if (s == r.s + r.len && d == r.d + r.len && (r.d < r.s || r.d >= r.s + r.len + 1)) {
        ++r.len;
        continue;
      }
    }
    runs[k++] = Run{s, d, 1};
  }
  return k;
}

template <int64_t E>
int gather(void* buf, int64_t outer, int64_t cap, int64_t inner, const int64_t* src,
           const int64_t* dst, int64_t n) {
  int64_t rb = 0;
  const int rc = check_gather(buf, outer, cap, inner, E, src, dst, n, &rb);
  if (rc != RAPID_KV_OK) return rc < 0 ? rc : RAPID_KV_OK;

  constexpr int64_t kStackRuns = 128;
  Run stack_runs[kStackRuns];
  std::vector<Run> heap_runs;
  Run* runs = stack_runs;
  if (n > kStackRuns) {
    try {
      heap_runs.resize(static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      return RAPID_KV_ERR_NOMEM;
    }
    runs = heap_runs.data();
  }
  const int64_t k = make_runs(src, dst, n, runs);
  if (k == 0) return RAPID_KV_OK;

  // Planes (o) are independent, so iterating o outermost is equivalent to the
  // documented "for i: for o" order and walks memory plane by plane.
  char* base = static_cast<char*>(buf);
  const size_t row = static_cast<size_t>(rb);
  const size_t plane = static_cast<size_t>(cap) * row;
  for (int64_t o = 0; o < outer; ++o, base += plane) {
    for (int64_t j = 0; j < k; ++j) {
      const Run& r = runs[j];
      char* to = base + static_cast<size_t>(r.d) * row;
      const char* from = base + static_cast<size_t>(r.s) * row;
      if (r.len == 1) {
        std::memcpy(to, from, row);  // distinct rows never overlap
      } else {
        std::memmove(to, from, static_cast<size_t>(r.len) * row);
      }
    }
  }
  return RAPID_KV_OK;
}

template <int64_t E>
int copy_range(const void* src_buf, void* dst_buf, int64_t outer, int64_t scap, int64_t dcap,
               int64_t inner, int64_t ss, int64_t ds, int64_t len) {
  int64_t rb = 0;
  bool same = false;
  const int rc =
      check_copy_range(src_buf, dst_buf, outer, scap, dcap, inner, E, ss, ds, len, &rb, &same);
  if (rc != RAPID_KV_OK) return rc < 0 ? rc : RAPID_KV_OK;
  const size_t row = static_cast<size_t>(rb);
  const size_t bytes = static_cast<size_t>(len) * row;
  const char* s = static_cast<const char*>(src_buf) + static_cast<size_t>(ss) * row;
  char* d = static_cast<char*>(dst_buf) + static_cast<size_t>(ds) * row;
  const size_t s_plane = static_cast<size_t>(scap) * row;
  const size_t d_plane = static_cast<size_t>(dcap) * row;
  for (int64_t o = 0; o < outer; ++o, s += s_plane, d += d_plane) {
    if (same) {
      std::memmove(d, s, bytes);  // same plane, possibly overlapping ranges
    } else {
      std::memcpy(d, s, bytes);
    }
  }
  return RAPID_KV_OK;
}

}  // namespace

extern "C" {

RAPID_KV_API int rapid_kvops_abi_version(void) { return RAPID_KVOPS_ABI_VERSION; }

#define RAPID_KV_DEFINE_CPU(SUFFIX, BYTES)                                                  \
  RAPID_KV_API int rapid_kv_gather_##SUFFIX(void* buf, int64_t outer, int64_t seq_cap,     \
                                            int64_t inner, const int64_t* src,             \
                                            const int64_t* dst, int64_t n) {               \
    return gather<BYTES>(buf, outer, seq_cap, inner, src, dst, n);                         \
  }                                                                                        \
  RAPID_KV_API int rapid_kv_copy_range_##SUFFIX(                                           \
      const void* src_buf, void* dst_buf, int64_t outer, int64_t src_cap, int64_t dst_cap, \
      int64_t inner, int64_t src_start, int64_t dst_start, int64_t len) {                  \
    return copy_range<BYTES>(src_buf, dst_buf, outer, src_cap, dst_cap, inner, src_start,  \
                             dst_start, len);                                              \
  }

RAPID_KV_DEFINE_CPU(f16, 2)
RAPID_KV_DEFINE_CPU(f32, 4)
RAPID_KV_DEFINE_CPU(f64, 8)

#undef RAPID_KV_DEFINE_CPU

}  // extern "C"
