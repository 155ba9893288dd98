// librapid_kvops_cuda_emu: a CPU-only stand-in for librapid_kvops_cuda, for
// tests on machines without a GPU. It exports the same CUDA ABI, runs the same
// host planner and kernel bodies (kvops_cuda_impl.h), and executes every
// "launch" serially over its thread indices; host memory plays device memory
// and the stream argument is ignored. It checks the planning, chunking and
// index arithmetic of the CUDA path, not GPU concurrency (threads run in
// reverse index order, so a plan that relied on launch order would show up as
// a mismatch). Never ship it.
#include <cstdlib>
#include <cstring>

#include "kvops_cuda_impl.h"

namespace {

using rapid_kv::GatherParams;

struct EmuBackend {
  template <class W>
  int parallel(const GatherParams& p, int64_t threads, void*) {
    // Reverse thread order: a plan that wrongly relied on launch order breaks here.
    for (int64_t t = threads - 1; t >= 0; --t) rapid_kv::gather_parallel_body<W>(p, t);
    return RAPID_KV_OK;
  }

  template <class W, bool kSnapshot>
  int column(const GatherParams& p, int64_t threads, void*) {
    for (int64_t t = threads - 1; t >= 0; --t) rapid_kv::gather_column_body<W, kSnapshot>(p, t);
    return RAPID_KV_OK;
  }

  int memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height, void*) {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch,
                  static_cast<const char*>(src) + r * spitch, width);
    }
    return RAPID_KV_OK;
  }
};

EmuBackend g_backend;

}  // namespace

extern "C" {

RAPID_KV_API int rapid_kvops_cuda_abi_version(void) { return RAPID_KVOPS_ABI_VERSION; }
RAPID_KV_API int rapid_kv_cuda_is_emulation(void) { return 1; }

RAPID_KV_DEFINE_CUDA_ABI(g_backend)

RAPID_KV_API const char* rapid_kv_cuda_last_error_string(void) { return "no error (emulation)"; }

RAPID_KV_API int rapid_kv_cuda_device_count(int* count) {
  if (count == nullptr) return RAPID_KV_ERR_ARG;
  *count = 1;  // the emulated device
  return RAPID_KV_OK;
}

RAPID_KV_API int rapid_kv_cuda_malloc(void** ptr, int64_t bytes) {
  if (ptr == nullptr || bytes < 0) return RAPID_KV_ERR_ARG;
  *ptr = std::malloc(bytes > 0 ? static_cast<size_t>(bytes) : 1);
  return *ptr != nullptr ? RAPID_KV_OK : RAPID_KV_ERR_NOMEM;
}

RAPID_KV_API int rapid_kv_cuda_free(void* ptr) {
  std::free(ptr);
  return RAPID_KV_OK;
}

RAPID_KV_API int rapid_kv_cuda_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return RAPID_KV_ERR_ARG;
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  return RAPID_KV_OK;
}

RAPID_KV_API int rapid_kv_cuda_stream_synchronize(void*) { return RAPID_KV_OK; }

}  // extern "C"
