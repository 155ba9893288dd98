// One ISA's kernels as function pointers (rowops_impl.h compiled per ISA; rowops.cpp picks one).
#pragma once
#include <cstdint>

using LinF32 = void (*)(const float*, int64_t, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t);
using LinBf16 = void (*)(const float*, int64_t, int64_t, const uint16_t*, int64_t, const float*, float*, int64_t,
                         int64_t);
template <typename T>
using Attn = void (*)(const float*, float*, int64_t, int64_t, int64_t, int64_t, float, const int64_t*, const int64_t*,
                      const int64_t*, const int64_t*, const T*, const T*, int64_t, const int64_t*, const int64_t*);

struct RowOpsTable {
    const char* name;
    int64_t (*block_width)();
    int64_t (*packed_size_f32)(int64_t, int64_t);
    int64_t (*packed_size_bf16)(int64_t, int64_t);
    void (*pack_f32)(const float*, int64_t, int64_t, float*);
    void (*pack_bf16)(const uint16_t*, int64_t, int64_t, uint16_t*);
    LinF32 linear_f32;
    LinBf16 linear_bf16;
    void (*rms_f32)(const float*, int64_t, int64_t, const float*, float, float*);
    void (*rms_bf16)(const float*, int64_t, int64_t, const uint16_t*, float, float*);
    void (*rope)(float*, int64_t, int64_t, int64_t, const float*, const float*);
    void (*silu_mul)(const float*, const float*, int64_t, int64_t, float*);
    Attn<float> attn_f32;
    Attn<uint16_t> attn_bf16;
};

#define ROWOPS_TABLE(ISA)                                                                                    \
    RowOpsTable rowops_table_##ISA() {                                                                       \
        using namespace rowops_##ISA;                                                                        \
        return RowOpsTable{#ISA,       block_width,      packed_size_f32, packed_size_bf16, pack_f32,        \
                           pack_bf16,  linear_f32,       linear_bf16,     rms_norm<float>,  rms_norm<uint16_t>, \
                           rope,       silu_mul,         attention<float>, attention<uint16_t>};             \
    }

RowOpsTable rowops_table_generic();
#if defined(ROWOPS_X86)
RowOpsTable rowops_table_avx2();
RowOpsTable rowops_table_avx512();
RowOpsTable rowops_table_avx512bf16();
#if defined(ROWOPS_AMX_BUILT)
RowOpsTable rowops_table_amx();
#endif
#endif
