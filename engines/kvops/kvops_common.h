// Internal helpers shared by the CPU kernels, the CUDA host code and the CUDA
// emulation library: argument validation with overflow checks. Not installed.
#ifndef RAPID_KVOPS_COMMON_H
#define RAPID_KVOPS_COMMON_H

#include <cstddef>
#include <cstdint>

#include "kvops.h"

namespace rapid_kv {

// a * b without overflow into *out (all operands non-negative).
inline bool mul_ok(int64_t a, int64_t b, int64_t* out) {
  if (a != 0 && b > INT64_MAX / a) return false;
  *out = a * b;
  return true;
}

// Bytes of one row and of the whole buffer; false on overflow.
inline bool buffer_bytes(int64_t outer, int64_t cap, int64_t inner, int64_t elem,
                         int64_t* row_bytes, int64_t* total_bytes) {
  int64_t rb = 0, plane = 0, total = 0;
  if (!mul_ok(inner, elem, &rb)) return false;
  if (!mul_ok(cap, rb, &plane)) return false;
  if (!mul_ok(outer, plane, &total)) return false;
  if (static_cast<uint64_t>(total) > static_cast<uint64_t>(SIZE_MAX)) return false;
  *row_bytes = rb;
  *total_bytes = total;
  return true;
}

// Validate a gather call. Returns RAPID_KV_OK when the call must proceed,
// 1 when it is a valid no-op, or a negative error code.
inline int check_gather(const void* buf, int64_t outer, int64_t cap, int64_t inner, int64_t elem,
                        const int64_t* src, const int64_t* dst, int64_t n, int64_t* row_bytes) {
  if (n < 0 || outer < 0 || cap < 0 || inner < 0) return RAPID_KV_ERR_ARG;
  if (n == 0) return 1;
  if (src == nullptr || dst == nullptr) return RAPID_KV_ERR_ARG;
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] < 0 || src[i] >= cap || dst[i] < 0 || dst[i] >= cap) return RAPID_KV_ERR_INDEX;
  }
  int64_t total = 0;
  if (!buffer_bytes(outer, cap, inner, elem, row_bytes, &total)) return RAPID_KV_ERR_ARG;
  if (total == 0) return 1;
  if (buf == nullptr) return RAPID_KV_ERR_ARG;
  return RAPID_KV_OK;
}

// Validate a copy_range call; same return convention as check_gather.
// *same_layout is set when src and dst are the same buffer (pointer and cap).
inline int check_copy_range(const void* sb, const void* db, int64_t outer, int64_t scap,
                            int64_t dcap, int64_t inner, int64_t elem, int64_t ss, int64_t ds,
                            int64_t len, int64_t* row_bytes, bool* same_layout) {
  if (outer < 0 || scap < 0 || dcap < 0 || inner < 0 || len < 0) return RAPID_KV_ERR_ARG;
  if (ss < 0 || ds < 0 || ss > scap - len || ds > dcap - len) return RAPID_KV_ERR_INDEX;
  int64_t s_total = 0, d_total = 0, rb = 0;
  if (!buffer_bytes(outer, scap, inner, elem, &rb, &s_total)) return RAPID_KV_ERR_ARG;
  if (!buffer_bytes(outer, dcap, inner, elem, &rb, &d_total)) return RAPID_KV_ERR_ARG;
  *row_bytes = rb;
  if (len == 0 || outer == 0 || inner == 0) return 1;
  if (sb == nullptr || db == nullptr) return RAPID_KV_ERR_ARG;
  *same_layout = (sb == db && scap == dcap);
  if (!*same_layout) {
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(sb), d0 = reinterpret_cast<uintptr_t>(db);
    const uintptr_t s1 = s0 + static_cast<uintptr_t>(s_total);
    const uintptr_t d1 = d0 + static_cast<uintptr_t>(d_total);
    if (s0 < d1 && d0 < s1) return RAPID_KV_ERR_OVERLAP;
  } else if (ss == ds) {
    return 1;
  }
  return RAPID_KV_OK;
}

}  // namespace rapid_kv

#endif  // RAPID_KVOPS_COMMON_H
