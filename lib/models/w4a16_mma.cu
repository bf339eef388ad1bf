// W4A16 on Hopper's tensor cores with mma.sync m16n8k16: y (M, N) = x (M, K) @ W (+ residual), AWQ int4 weights
// (group 128, zero point), fp16 or bf16; lib/models/w4a16_mma.py builds it with nvcc, packs the weights and calls it.
//
// A block takes 16 output columns (one m16 tile) and 8 activation rows (the n8 of the mma), or 16 in calls of more
// than 8 rows (two n8 tiles on each A fragment: the weights read once); grid.y walks the rows' blocks.
// Its warps split K in whole groups. Weights are the A operand, streamed from global memory straight into registers
// (no shared memory): a lane's 32-bit word holds the 8 codes of its A fragment for one 16-K step, and one 128-bit
// read brings four steps. The activations are the B operand: K is permuted within each 32 (the packing follows)
// so that a lane's halves of two steps are 8 contiguous ones of its row, one 128-bit read. int4 -> half without a
// conversion, as the Triton kernel does (lop3 into the bits of 1024.0 or 128.0, then sub / fma: q - z exactly).
// A group is summed in fp32 from zero, then scaled into the accumulator. The warps then add their sums in warp
// order through shared memory, rounding once (after the residual): deterministic, and a row's arithmetic does not
// depend on the other rows or on M (batch invariance). Two groups' loads are in flight while one is multiplied.
// Programmatic dependent launch: the first weights are read before the wait for the kernel before.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t lop3_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));   // (a & b) | c
    return d;
}

// a[j] = the codes at bits 4j and 16 + 4j of w minus the zero point: j even column g's (zz_lo), odd column g + 8's
template <bool BF16>
__device__ __forceinline__ void dequant(uint32_t w, uint32_t zz_lo, uint32_t zz_hi, uint32_t zh_hi, uint32_t a[4]) {
    if constexpr (!BF16) {      // odd j: codes 4 bits up make 1024 + 16c; one fma (/16, -(64 + z)) leaves c - z
        const uint32_t M = 0x64006400u;
        uint32_t w2 = w >> 8;
        uint32_t t0 = lop3_or(w, 0x000F000Fu, M), t1 = lop3_or(w, 0x00F000F0u, M);
        uint32_t t2 = lop3_or(w2, 0x000F000Fu, M), t3 = lop3_or(w2, 0x00F000F0u, M);
        asm("sub.f16x2 %0, %1, %2;" : "=r"(a[0]) : "r"(t0), "r"(zz_lo));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[1]) : "r"(t1), "r"(0x2C002C00u), "r"(zh_hi));
        asm("sub.f16x2 %0, %1, %2;" : "=r"(a[2]) : "r"(t2), "r"(zz_lo));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a[3]) : "r"(t3), "r"(0x2C002C00u), "r"(zh_hi));
    } else {                    // bf16's 7-bit mantissa: one shift a chunk
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t t = lop3_or(w >> (4 * j), 0x000F000Fu, 0x43004300u);
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

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {          // read once: past L1, L2 in 256-byte sectors
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

template <int RT>
struct Group {              // a lane's loads for one group: 8 weight words, 32 halves a row tile, 2 scale-zero words
    uint4 w[2];
    uint4 x[RT][4];
    uint32_t sz[2];
};

// words: (N/16, K/128, 2, 32, 4) int32, a tile's group of a lane at [tile, group, step / 4, lane, step % 4];
// groups: (K/128, N) int32 with rows stride_g apart (>= N: a fused projection's column view), a column's scale (low
// half) and zero point's code (high half)
// RT row tiles of 8 a block (1; 2 for calls of more than 8 rows): each tile is one more mma on the same A fragment
template <bool BF16, int RT>
__global__ void __launch_bounds__(256) w4a16_mma(const uint16_t* __restrict__ x, const uint4* __restrict__ words,
                                                 const uint32_t* __restrict__ groups, const uint16_t* __restrict__ res,
                                                 uint16_t* __restrict__ out, int M, int N, int K, int stride_x,
                                                 int stride_g) {
    extern __shared__ float red[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3, tile = blockIdx.x, row0 = blockIdx.y * 8 * RT;
    const int G = K >> 7, gb = warp * G / warps, ge = (warp + 1) * G / warps;
    // cursors at the next group to load: the lane's weights, scale-and-zero words (columns g, g + 8), activations
    const uint4* wc = words + ((size_t)tile * G + gb) * 64 + lane;
    const uint32_t* gc = groups + (size_t)gb * stride_g + tile * 16 + g;
    bool row_ok[RT];                                    // rows past M read as zeros
    const uint4* xc[RT];
#pragma unroll
    for (int t = 0; t < RT; ++t) {
        row_ok[t] = row0 + 8 * t + g < M;
        const int row = row_ok[t] ? row0 + 8 * t + g : 0;
        xc[t] = reinterpret_cast<const uint4*>(x + (size_t)row * stride_x) + gb * 16 + c;
    }
    float acc[RT][4] = {};

    auto load = [&](Group<RT>& q, bool weights) {
        if (weights) {
            q.w[0] = ld_stream(wc);
            q.w[1] = ld_stream(wc + 32);
        }
        wc += 64;
        q.sz[0] = __ldg(gc);
        q.sz[1] = __ldg(gc + 8);
        gc += stride_g;
#pragma unroll
        for (int t = 0; t < RT; ++t) {
#pragma unroll
            for (int p = 0; p < 4; ++p) q.x[t][p] = row_ok[t] ? __ldg(xc[t] + p * 4) : make_uint4(0, 0, 0, 0);
            xc[t] += 16;
        }
    };
    auto multiply = [&](const Group<RT>& q) {
        float part[RT][4] = {};
        const uint32_t z0 = (q.sz[0] >> 16) & 0xF, z1 = (q.sz[1] >> 16) & 0xF;
        const uint32_t zz_lo = ((BF16 ? 0x4300u : 0x6400u) | z0) * 0x10001u;
        const uint32_t zz_hi = ((BF16 ? 0x4300u : 0x6400u) | z1) * 0x10001u;
        const uint32_t zh_hi = ((z1 << 4) | 0xD400u) * 0x10001u;              // -(64 + z) in fp16, twice
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const uint32_t* ws = reinterpret_cast<const uint32_t*>(&q.w[s >> 2]);
            uint32_t a[4];
            dequant<BF16>(ws[s & 3], zz_lo, zz_hi, zh_hi, a);
#pragma unroll
            for (int t = 0; t < RT; ++t) {
                const uint32_t* xs = reinterpret_cast<const uint32_t*>(&q.x[t][s >> 1]);
                mma<BF16>(part[t], a, xs[(s & 1) * 2], xs[(s & 1) * 2 + 1]);
            }
        }
        const float s0 = to_float<BF16>(q.sz[0]), s1 = to_float<BF16>(q.sz[1]);
#pragma unroll
        for (int t = 0; t < RT; ++t) {
            acc[t][0] += part[t][0] * s0;
            acc[t][1] += part[t][1] * s0;
            acc[t][2] += part[t][2] * s1;
            acc[t][3] += part[t][3] * s1;
        }
    };
    Group<RT> A, B;
    if (gb < ge) {                                      // the weights are not written by the kernel before
        A.w[0] = ld_stream(wc);
        A.w[1] = ld_stream(wc + 32);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (gb < ge) load(A, false);
    for (int gi = gb; gi < ge; gi += 2) {               // ping-pong: no register copies between groups
        if (gi + 1 < ge) load(B, true);
        multiply(A);
        if (gi + 1 >= ge) break;
        if (gi + 2 < ge) load(A, true);
        multiply(B);
    }
    asm volatile("griddepcontrol.launch_dependents;");
#pragma unroll
    for (int t = 0; t < RT; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) red[((warp * RT + t) * 4 + r) * 32 + lane] = acc[t][r];
    __syncthreads();
    if (threadIdx.x < 128)                              // c0, c1: column g, rows 2c, 2c + 1; c2, c3: column g + 8
#pragma unroll
    for (int t = 0; t < RT; ++t) {
        const int r = threadIdx.x >> 5, l = threadIdx.x & 31;
        const int m = row0 + 8 * t + 2 * (l & 3) + (r & 1), n = tile * 16 + (l >> 2) + 8 * (r >> 1);
        if (m < M) {
            float sum = 0.f;
            for (int w = 0; w < warps; ++w) sum += red[((w * RT + t) * 4 + r) * 32 + l];     // in warp order
            if (res) sum += to_float<BF16>(res[(size_t)m * N + n]);
            out[(size_t)m * N + n] = BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(sum))
                                          : __half_as_ushort(__float2half_rn(sum));
        }
    }
}

// 0, or a CUDA error; -1 for arguments the kernel does not take (4-8 warps: the epilogue's 128 threads write a tile)
extern "C" int w4a16_mma_launch(const void* x, const void* words, const void* groups, const void* res, void* out,
                                int M, int N, int K, int stride_x, int stride_g, int warps, int bf16, int pdl,
                                void* stream) {
    if (M < 1 || N % 16 || K % 128 || stride_x % 8 || stride_g < N || warps < 4 || warps > 8) return -1;
    cudaLaunchConfig_t cfg = {};
    const int rt = M > 8 ? 2 : 1;
    cfg.gridDim = dim3(N / 16, (M + 8 * rt - 1) / (8 * rt));
    cfg.blockDim = dim3(32 * warps);
    cfg.dynamicSmemBytes = warps * rt * 128 * sizeof(float);
    cfg.stream = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    auto kernel = rt == 2 ? (bf16 ? w4a16_mma<true, 2> : w4a16_mma<false, 2>)
                          : (bf16 ? w4a16_mma<true, 1> : w4a16_mma<false, 1>);
    return (int)cudaLaunchKernelEx(&cfg, kernel, (const uint16_t*)x, (const uint4*)words, (const uint32_t*)groups,
                                   (const uint16_t*)res, (uint16_t*)out, M, N, K, stride_x, stride_g);
}
