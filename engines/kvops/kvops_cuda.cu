// CUDA kernels of librapid_kvops_cuda; semantics in kvops.h, planner and
// kernel bodies in kvops_cuda_impl.h (shared with the host emulation).
#include <cuda_runtime.h>

#include "kvops_cuda_impl.h"

namespace {

using rapid_kv::GatherParams;

thread_local const char* g_last_error = "no error";

int fail(cudaError_t err) {
  g_last_error = cudaGetErrorString(err);
  return RAPID_KV_ERR_CUDA;
}

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops cover the rest

inline unsigned grid_for(int64_t threads) {
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <class W>
__global__ void __launch_bounds__(kBlock) k_gather_parallel(const GatherParams p, int64_t threads) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < threads;
       t += stride) {
    rapid_kv::gather_parallel_body<W>(p, t);
  }
}

template <class W, bool kSnapshot>
__global__ void __launch_bounds__(kBlock) k_gather_column(const GatherParams p, int64_t threads) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < threads;
       t += stride) {
    rapid_kv::gather_column_body<W, kSnapshot>(p, t);
  }
}

struct CudaBackend {
  template <class W>
  int parallel(const GatherParams& p, int64_t threads, void* stream) {
    if (threads <= 0) return RAPID_KV_OK;
    k_gather_parallel<W><<<grid_for(threads), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        p, threads);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? RAPID_KV_OK : fail(err);
  }

  template <class W, bool kSnapshot>
  int column(const GatherParams& p, int64_t threads, void* stream) {
    if (threads <= 0) return RAPID_KV_OK;
    k_gather_column<W, kSnapshot>
        <<<grid_for(threads), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(p, threads);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? RAPID_KV_OK : fail(err);
  }

  int memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height, void* stream) {
    const cudaError_t err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                              cudaMemcpyDefault,
                                              static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? RAPID_KV_OK : fail(err);
  }
};

CudaBackend g_backend;

}  // namespace

extern "C" {

RAPID_KV_API int rapid_kvops_cuda_abi_version(void) { return RAPID_KVOPS_ABI_VERSION; }
RAPID_KV_API int rapid_kv_cuda_is_emulation(void) { return 0; }

RAPID_KV_DEFINE_CUDA_ABI(g_backend)

RAPID_KV_API const char* rapid_kv_cuda_last_error_string(void) { return g_last_error; }

RAPID_KV_API int rapid_kv_cuda_device_count(int* count) {
  if (count == nullptr) return RAPID_KV_ERR_ARG;
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    return fail(err);
  }
  return RAPID_KV_OK;
}

RAPID_KV_API int rapid_kv_cuda_malloc(void** ptr, int64_t bytes) {
  if (ptr == nullptr || bytes < 0) return RAPID_KV_ERR_ARG;
  const cudaError_t err = cudaMalloc(ptr, static_cast<size_t>(bytes));
  return err == cudaSuccess ? RAPID_KV_OK : fail(err);
}

RAPID_KV_API int rapid_kv_cuda_free(void* ptr) {
  const cudaError_t err = cudaFree(ptr);
  return err == cudaSuccess ? RAPID_KV_OK : fail(err);
}

RAPID_KV_API int rapid_kv_cuda_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return RAPID_KV_ERR_ARG;
  const cudaError_t err = cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault);
  return err == cudaSuccess ? RAPID_KV_OK : fail(err);
}

RAPID_KV_API int rapid_kv_cuda_stream_synchronize(void* stream) {
  const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return err == cudaSuccess ? RAPID_KV_OK : fail(err);
}

}  // extern "C"
