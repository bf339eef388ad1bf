// W4A16 for 1-8 activation rows on the tensor cores with mma.sync m16n8k16 (experiment, thirty-sixth session).
// Weights are the A operand (16 output columns x 16 K a tile and step), streamed from global memory straight into
// registers (no shared memory), each lane's 32-bit word holding the 8 codes of its A fragment; the activations are
// the B operand (16 K x 8 rows), a lane's 8 halves of one row loaded as one 128-bit read per two steps (K permuted
// within each 32 so that they are contiguous; the weights' packing follows the same permutation). int4 -> half as in
// lib/models/w4a16.py (lop3 into the bits of 1024.0 or 128.0, then sub / fma). A group (128 K) is summed in fp32
// from zero and scaled into the accumulator. The warps of a block split K (whole groups), then add their sums in
// warp order through shared memory: deterministic, and a row's arithmetic does not depend on the other rows.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t lop3_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));   // (a & b) | c
    return d;
}

template <bool BF16>
__device__ __forceinline__ void dequant(uint32_t w, uint32_t zz_lo, uint32_t zz_hi, uint32_t zh_hi, uint32_t a[4]) {
    // a[j] = the codes at bits 4j and 16 + 4j minus the zero point (j even: column g's, odd: column g + 8's)
    if constexpr (!BF16) {
        const uint32_t M = 0x64006400u;
        uint32_t w2 = w >> 8;
        uint32_t t0 = lop3_or(w, 0x000F000Fu, M), t1 = lop3_or(w, 0x00F000F0u, M);
        uint32_t t2 = lop3_or(w2, 0x000F000Fu, M), t3 = lop3_or(w2, 0x00F000F0u, M);
        asm("sub.f16x2 %0, %1, %2;" : "=r"(a[0]) : "r"(t0), "r"(zz_lo));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[1]) : "r"(t1), "r"(0x2C002C00u), "r"(zh_hi));
        asm("sub.f16x2 %0, %1, %2;" : "=r"(a[2]) : "r"(t2), "r"(zz_lo));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[3]) : "r"(t3), "r"(0x2C002C00u), "r"(zh_hi));
    } else {
        const uint32_t M = 0x43004300u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t t = lop3_or(w >> (4 * j), 0x000F000Fu, M);
            asm("sub.bf16x2 %0, %1, %2;" : "=r"(a[j]) : "r"(t), "r"(j & 1 ? zz_hi : zz_lo));
        }
    }
}

template <bool BF16>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (!BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};" : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};" : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <bool BF16>
__device__ __forceinline__ float to_float(uint32_t bits) {
    if constexpr (!BF16) return __half2float(__ushort_as_half((unsigned short)(bits & 0xFFFF)));
    else return __bfloat162float(__ushort_as_bfloat16((unsigned short)(bits & 0xFFFF)));
}

template <int TN>
struct Group {            // one group's loads for a lane: weights (8 words a tile), activations, scale-and-zero words
    uint4 w[TN][2];
    uint4 x[4];
    uint32_t sz[TN][2];
};

// words: (N/16 tiles, K/128 groups, 2, 32 lanes, 4) int32; groups: (K/128, N) int32 (scale bits | zero code << 16)
template <int TN, bool BF16>
__global__ void __launch_bounds__(256) w4a16_mma(const uint16_t* __restrict__ x, const uint4* __restrict__ words,
                                                 const uint32_t* __restrict__ groups, const uint16_t* __restrict__ res,
                                                 uint16_t* __restrict__ out, int M, int N, int K, int stride_x) {
    extern __shared__ float red[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int G = K >> 7, tile0 = blockIdx.x * TN;
    const int gb = warp * G / warps, ge = (warp + 1) * G / warps;
    const uint4* wp[TN];
#pragma unroll
    for (int t = 0; t < TN; ++t) wp[t] = words + ((size_t)(tile0 + t) * G * 64) + lane;      // 64 uint4 a group
    const bool row_ok = g < M;
    const uint4* xp = reinterpret_cast<const uint4*>(x + (size_t)(row_ok ? g : 0) * stride_x) + c;   // 8 halves
    float acc[TN][4];
#pragma unroll
    for (int t = 0; t < TN; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

    // cursors at the next group to load: a lane's weights, its scale-and-zero words, its activations
    const uint4* wc[TN];
    const uint32_t* gc = groups + (size_t)gb * N + tile0 * 16 + g;
    const uint4* xc = xp + gb * 16;
#pragma unroll
    for (int t = 0; t < TN; ++t) wc[t] = wp[t] + gb * 64;
    auto load = [&](Group<TN>& q, bool weights) {
#pragma unroll
        for (int t = 0; t < TN; ++t) {
            if (weights) {
                q.w[t][0] = ld_stream(wc[t]);
                q.w[t][1] = ld_stream(wc[t] + 32);
            }
            wc[t] += 64;
            q.sz[t][0] = __ldg(gc + t * 16);
            q.sz[t][1] = __ldg(gc + t * 16 + 8);
        }
        gc += N;
#pragma unroll
        for (int p = 0; p < 4; ++p) q.x[p] = row_ok ? __ldg(xc + p * 4) : make_uint4(0, 0, 0, 0);
        xc += 16;
    };
    auto compute = [&](const Group<TN>& q) {
        float part[TN][4];
        uint32_t zz_lo[TN], zz_hi[TN], zh_hi[TN];
#pragma unroll
        for (int t = 0; t < TN; ++t) {
            part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.f;
            const uint32_t z0 = (q.sz[t][0] >> 16) & 0xF, z1 = (q.sz[t][1] >> 16) & 0xF;
            zz_lo[t] = ((BF16 ? 0x4300u : 0x6400u) | z0) * 0x10001u;
            zz_hi[t] = ((BF16 ? 0x4300u : 0x6400u) | z1) * 0x10001u;
            zh_hi[t] = ((z1 << 4) | 0xD400u) * 0x10001u;                      // -(64 + z) in fp16, twice
        }
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const uint32_t* xs = reinterpret_cast<const uint32_t*>(&q.x[s >> 1]);
            const uint32_t b0 = xs[(s & 1) * 2], b1 = xs[(s & 1) * 2 + 1];
#pragma unroll
            for (int t = 0; t < TN; ++t) {
                const uint32_t* ws = reinterpret_cast<const uint32_t*>(&q.w[t][s >> 2]);
                uint32_t a[4];
                dequant<BF16>(ws[s & 3], zz_lo[t], zz_hi[t], zh_hi[t], a);
                mma<BF16>(part[t], a, b0, b1);
            }
        }
#pragma unroll
        for (int t = 0; t < TN; ++t) {
            const float s0 = to_float<BF16>(q.sz[t][0]), s1 = to_float<BF16>(q.sz[t][1]);
            acc[t][0] += part[t][0] * s0;
            acc[t][1] += part[t][1] * s0;
            acc[t][2] += part[t][2] * s1;
            acc[t][3] += part[t][3] * s1;
        }
    };
    Group<TN> A, B;                               // two groups in flight: compute one while the next one loads
    if (gb < ge) {
#pragma unroll
        for (int t = 0; t < TN; ++t) {            // the weights before the wait: the kernel before does not write them
            A.w[t][0] = ld_stream(wc[t]);
            A.w[t][1] = ld_stream(wc[t] + 32);
        }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (gb < ge) load(A, false);
    for (int gi = gb; gi < ge; gi += 2) {
        if (gi + 1 < ge) load(B, true);
        compute(A);
        if (gi + 1 >= ge) break;
        if (gi + 2 < ge) load(A, true);
        compute(B);
    }
    asm volatile("griddepcontrol.launch_dependents;");
#pragma unroll
    for (int t = 0; t < TN; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) red[(warp * TN * 4 + t * 4 + r) * 32 + lane] = acc[t][r];
    __syncthreads();
    for (int i = threadIdx.x; i < TN * 128; i += blockDim.x) {
        const int t = i >> 7, r = (i >> 5) & 3, l = i & 31;
        const int m = 2 * (l & 3) + (r & 1), n = (tile0 + t) * 16 + (l >> 2) + 8 * (r >> 1);
        if (m >= M) continue;
        float sum = 0.f;
        for (int w = 0; w < warps; ++w) sum += red[(w * TN * 4 + t * 4 + r) * 32 + l];     // in warp order
        if (res) sum += to_float<BF16>(res[(size_t)m * N + n]);
        uint16_t bits;
        if constexpr (!BF16) bits = __half_as_ushort(__float2half_rn(sum));
        else bits = __bfloat16_as_ushort(__float2bfloat16_rn(sum));
        out[(size_t)m * N + n] = bits;
    }
}

template <int TN, bool BF16>
static int launch(const void* x, const void* words, const void* groups, const void* res, void* out, int M, int N,
                  int K, int stride_x, int warps, int pdl, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(N / (16 * TN));
    cfg.blockDim = dim3(32 * warps);
    cfg.dynamicSmemBytes = warps * TN * 128 * sizeof(float);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, w4a16_mma<TN, BF16>, (const uint16_t*)x, (const uint4*)words,
                                   (const uint32_t*)groups, (const uint16_t*)res, (uint16_t*)out, M, N, K, stride_x);
}

extern "C" int w4a16_mma_launch(const void* x, const void* words, const void* groups, const void* res, void* out,
                                int M, int N, int K, int stride_x, int tn, int warps, int bf16, int pdl,
                                void* stream) {
    if (M < 1 || M > 8 || N % (16 * tn) || K % 128 || warps < 1 || warps > 8) return -1;
    cudaStream_t s = (cudaStream_t)stream;
#define W4_CASE(T) \
    if (tn == T) return bf16 ? launch<T, true>(x, words, groups, res, out, M, N, K, stride_x, warps, pdl, s) \
                             : launch<T, false>(x, words, groups, res, out, M, N, K, stride_x, warps, pdl, s);
    W4_CASE(1) W4_CASE(2) W4_CASE(4)
#undef W4_CASE
    return -2;
}
