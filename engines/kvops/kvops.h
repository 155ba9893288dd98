/*
 * RAPID native KV-cache kernels: move entries along the sequence axis of a
 * preallocated KV buffer.
 *
 * Layout
 * ------
 * A KV buffer is a C-contiguous array shaped [outer, seq_cap, inner]:
 *   outer   = everything before the sequence axis (e.g. layers * 2 * kv_heads),
 *   seq_cap = the number of preallocated positions,
 *   inner   = everything after it (e.g. head_dim).
 * One "row" is the `inner` elements buf[o, p, :]; its size in bytes is
 * inner * sizeof(element). The kernels never interpret the data, they only
 * move bytes, so the f16 entry points serve any 2-byte type (fp16, bf16 bits),
 * f32 any 4-byte type and f64 any 8-byte type.
 *
 * Gather semantics (CPU and CUDA alike)
 * -------------------------------------
 *   for i in 0 .. n-1, in this order:
 *       for every o: buf[o, dst[i], :] = buf[o, src[i], :]
 * i.e. *sequential* semantics: move i sees the effect of moves 0 .. i-1.
 * The result equals the "snapshot" semantics buf_new[dst[i]] = buf_old[src[i]]
 * whenever no src[i] equals an earlier dst[j] (j < i). In particular
 * IN-PLACE COMPACTION IS SAFE when dst is strictly ascending and
 * dst[i] <= src[i] for every i (e.g. moving an accepted tree path, sorted by
 * position, down to dst_start, dst_start+1, ...): every row is read before any
 * move can overwrite it.
 *
 * All indices are validated before anything is written: an index outside
 * [0, seq_cap) makes the call return RAPID_KV_ERR_INDEX and leave the buffer
 * untouched. n == 0, outer == 0 or inner == 0 are no-ops that return
 * RAPID_KV_OK.
 *
 * Copy-range semantics
 * --------------------
 *   for every o: dst_buf[o, dst_start : dst_start+len, :] =
 *                src_buf[o, src_start : src_start+len, :]
 * with memmove semantics (the source is read as it was before the call).
 * src_buf and dst_buf must either be the same buffer (same pointer and
 * src_cap == dst_cap; overlapping ranges are then fine) or not overlap in
 * memory at all; otherwise RAPID_KV_ERR_OVERLAP. Ranges must fit:
 * 0 <= src_start, src_start+len <= src_cap, same for dst; len >= 0.
 *
 * CUDA entry points (librapid_kvops_cuda)
 * ---------------------------------------
 * Same semantics; `buf`, `src_buf`, `dst_buf` are device pointers (anything
 * cudaMemcpyDefault accepts: device, managed, pinned host), while the index
 * arrays `src`/`dst` are HOST pointers (they are validated and planned on the
 * host and passed to the kernels by value, in chunks of RAPID_KV_CUDA_CHUNK,
 * so no device allocation or host->device copy happens per call). `stream`
 * is a cudaStream_t (NULL = legacy default stream). The work is enqueued
 * asynchronously; the host index arrays may be reused as soon as the call
 * returns.
 *
 * Parallel writes on the GPU cannot race: the host plans each call as
 *  - PARALLEL  when no row is both read and written and dst has no duplicates
 *              (one thread per (o, i, word));
 *  - SNAPSHOT  when no src[i] equals an earlier dst[j] (compaction, copies
 *              with dst < src): one thread per (o, word) column loads a chunk
 *              of rows into registers and then stores them, in order;
 *  - SEQUENTIAL otherwise: one thread per (o, word) column performs the moves
 *              one after another, exactly as the CPU does.
 * A column is only ever touched by one thread, and columns are independent,
 * so SNAPSHOT/SEQUENTIAL reproduce the sequential semantics bit for bit.
 *
 * Return codes: 0 on success, negative RAPID_KV_ERR_* on failure.
 */
#ifndef RAPID_KVOPS_H
#define RAPID_KVOPS_H

#include <stdint.h>

#if defined(_WIN32)
#  define RAPID_KV_API __declspec(dllexport)
#else
#  define RAPID_KV_API __attribute__((visibility("default")))
#endif

#define RAPID_KVOPS_ABI_VERSION 1

#define RAPID_KV_OK 0
#define RAPID_KV_ERR_INDEX (-1)   /* an index / range outside [0, seq_cap) */
#define RAPID_KV_ERR_ARG (-2)     /* bad argument: NULL pointer, negative size, ... */
#define RAPID_KV_ERR_OVERLAP (-3) /* copy_range buffers overlap with different layouts */
#define RAPID_KV_ERR_CUDA (-4)    /* a CUDA runtime call failed; see rapid_kv_cuda_last_error_string */
#define RAPID_KV_ERR_NOMEM (-5)   /* host allocation failed */

/* Maximum number of moves the CUDA entry points pass to one kernel launch. */
#define RAPID_KV_CUDA_CHUNK 384

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU library: librapid_kvops -------------------------------------- */
RAPID_KV_API int rapid_kvops_abi_version(void);

RAPID_KV_API int rapid_kv_gather_f16(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                     const int64_t* src, const int64_t* dst, int64_t n);
RAPID_KV_API int rapid_kv_gather_f32(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                     const int64_t* src, const int64_t* dst, int64_t n);
RAPID_KV_API int rapid_kv_gather_f64(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                     const int64_t* src, const int64_t* dst, int64_t n);

RAPID_KV_API int rapid_kv_copy_range_f16(const void* src_buf, void* dst_buf, int64_t outer,
                                         int64_t src_cap, int64_t dst_cap, int64_t inner,
                                         int64_t src_start, int64_t dst_start, int64_t len);
RAPID_KV_API int rapid_kv_copy_range_f32(const void* src_buf, void* dst_buf, int64_t outer,
                                         int64_t src_cap, int64_t dst_cap, int64_t inner,
                                         int64_t src_start, int64_t dst_start, int64_t len);
RAPID_KV_API int rapid_kv_copy_range_f64(const void* src_buf, void* dst_buf, int64_t outer,
                                         int64_t src_cap, int64_t dst_cap, int64_t inner,
                                         int64_t src_start, int64_t dst_start, int64_t len);

/* ---- CUDA library: librapid_kvops_cuda ---------------------------------
 * (also exported, with host memory standing in for device memory, by the
 * CPU-only test library librapid_kvops_cuda_emu, which runs the same planner
 * and kernel bodies serially; rapid_kv_cuda_is_emulation() tells them apart) */
RAPID_KV_API int rapid_kvops_cuda_abi_version(void);
RAPID_KV_API int rapid_kv_cuda_is_emulation(void);

RAPID_KV_API int rapid_kv_gather_cuda_f16(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                          const int64_t* src, const int64_t* dst, int64_t n,
                                          void* stream);
RAPID_KV_API int rapid_kv_gather_cuda_f32(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                          const int64_t* src, const int64_t* dst, int64_t n,
                                          void* stream);
RAPID_KV_API int rapid_kv_gather_cuda_f64(void* buf, int64_t outer, int64_t seq_cap, int64_t inner,
                                          const int64_t* src, const int64_t* dst, int64_t n,
                                          void* stream);

RAPID_KV_API int rapid_kv_copy_range_cuda_f16(const void* src_buf, void* dst_buf, int64_t outer,
                                              int64_t src_cap, int64_t dst_cap, int64_t inner,
                                              int64_t src_start, int64_t dst_start, int64_t len,
                                              void* stream);
RAPID_KV_API int rapid_kv_copy_range_cuda_f32(const void* src_buf, void* dst_buf, int64_t outer,
                                              int64_t src_cap, int64_t dst_cap, int64_t inner,
                                              int64_t src_start, int64_t dst_start, int64_t len,
                                              void* stream);
RAPID_KV_API int rapid_kv_copy_range_cuda_f64(const void* src_buf, void* dst_buf, int64_t outer,
                                              int64_t src_cap, int64_t dst_cap, int64_t inner,
                                              int64_t src_start, int64_t dst_start, int64_t len,
                                              void* stream);

/* Small runtime helpers so callers (and the self-test) need no CUDA bindings. */
RAPID_KV_API const char* rapid_kv_cuda_last_error_string(void);
RAPID_KV_API int rapid_kv_cuda_device_count(int* count);
RAPID_KV_API int rapid_kv_cuda_malloc(void** ptr, int64_t bytes);
RAPID_KV_API int rapid_kv_cuda_free(void* ptr);
/* Synchronous copy between any two pointers (cudaMemcpyDefault). */
RAPID_KV_API int rapid_kv_cuda_memcpy(void* dst, const void* src, int64_t bytes);
RAPID_KV_API int rapid_kv_cuda_stream_synchronize(void* stream);

#ifdef __cplusplus
}
#endif

#endif /* RAPID_KVOPS_H */
