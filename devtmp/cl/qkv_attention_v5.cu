// One layer's RMSNorm + q/k/v GEMV + q/k RMS norms + RoPE + K/V cache write + single-query attention of one token
// in one kernel (Hopper): a thread-block cluster of CS blocks a query head. Each block computes 3*HD/CS of the
// head's q, k and v rows; the blocks trade them through distributed shared memory (no global round trip and no
// kernel boundary between the projection and the attention); each block attends over its splits of 16 positions,
// and block 0 combines the blocks' partials, again through distributed shared memory, in block order.
//
// Launched as a programmatic dependent launch (lib/engine/cluster_step.py): every block lets the next kernel launch
// at once, loads its weight rows, the norm weights, the rotary row and the older cache positions of its first
// splits, and only then waits for the kernel before it (which wrote the residual stream). Arithmetic follows
// decode.py's Triton kernels (fp32 norms rounded to the dtype before the weight multiply, fp32 dot products, q/k/v
// rounded to the dtype, RoPE in fp32 rounded once); the reduction orders differ, so the step is checked against the
// reference path where it is built, like the Triton one.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#ifndef QA_PROBE                // experiment: pieces left out (outputs wrong): 1 the q/k/v exchange, 2 the attention,
#define QA_PROBE 0              // 4 the weights' wait and dot products (zeros)
#endif

namespace cg = cooperative_groups;

constexpr int CS = 16, WARPS = 4, THREADS = 32 * WARPS, NJ = 4, PRE = 2, MIN_BLOCKS = 8;  // <= 64 registers   // NJ * 256: the largest hidden size

struct Args {                   // mirrored by cluster_step.py's ctypes structure
  const void *x;                // residual stream (D,), or the embedding table (embed)
  const int64_t *ids;           // embed: the token's id
  void *res;                    // embed: where block 0 writes the token's embedding row (the residual stream)
  const void *g;                // input RMSNorm weight (D,)
  const void *w;                // fused q/k/v weight ((HQ + 2 HKV) * HD, D)
  const void *qn, *kn;          // q/k RMS-norm weights (HD,); unused without qk_norm (Llama)
  const void *cos, *sin;        // rotary tables (L, HD)
  void *kc, *vc;                // this layer's cache (HKV, L, HD)
  const int64_t *pos;           // the token's position (device)
  void *out;                    // attention output (HQ * HD)
  int D, HQ, HKV, L, qk_norm, embed;
  float eps, scale;
};

__device__ __forceinline__ float2 pair(uint32_t u, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
}
__device__ __forceinline__ float2 pair(uint32_t u, __half) { return __half22float2(*reinterpret_cast<__half2 *>(&u)); }
__device__ __forceinline__ float rnd(float x, __nv_bfloat16) { return __bfloat162float(__float2bfloat16(x)); }
__device__ __forceinline__ float rnd(float x, __half) { return __half2float(__float2half(x)); }
__device__ __forceinline__ void put(void *p, int i, float x, __nv_bfloat16) {
  reinterpret_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(x);
}
__device__ __forceinline__ void put(void *p, int i, float x, __half) { reinterpret_cast<__half *>(p)[i] = __float2half(x); }
template <typename T> __device__ __forceinline__ float get(const void *p, int64_t i) {
  return pair(uint32_t(reinterpret_cast<const uint16_t *>(p)[i]), T()).x;
}

// Weights copied to shared memory without passing through registers, issued before the wait.
__device__ __forceinline__ void cp16(void *smem, const void *p) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(p));
}

// Loads issued in program order (volatile asm is not moved across the wait below), through the read-only path.
__device__ __forceinline__ uint4 ld16(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <int E> struct Vec { uint32_t u[E / 2]; };
template <int E> __device__ __forceinline__ Vec<E> ldv(const void *p) {
  Vec<E> v;
  if constexpr (E == 4) asm volatile("ld.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.u[0]), "=r"(v.u[1]) : "l"(p));
  else asm volatile("ld.global.u32 %0, [%1];" : "=r"(v.u[0]) : "l"(p));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Online softmax state of one query over some positions: max, sum of exp, weighted V (the lane's E dimensions).
template <int E> struct Part {
  float m = -INFINITY, l = 0.f, acc[E] = {};
  __device__ void add(float s, const float *v) {
    float m2 = fmaxf(m, s), a = __expf(m - m2), e = __expf(s - m2);
    l = l * a + e;
    for (int i = 0; i < E; i++) acc[i] = acc[i] * a + e * v[i];
    m = m2;
  }
  __device__ void merge(float m1, float l1, const float *acc1) {       // another state, after this one
    if (m1 == -INFINITY) return;
    float m2 = fmaxf(m, m1), a = __expf(m - m2), b = __expf(m1 - m2);
    l = l * a + l1 * b;
    for (int i = 0; i < E; i++) acc[i] = acc[i] * a + acc1[i] * b;
    m = m2;
  }
};

template <typename T, int HD, int G>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) qkv_attention(const Args a) {
  constexpr int E = HD / 32, RPC = (G + 2) * HD / CS, RPW = RPC / WARPS;   // lane's head dims; rows a block, a warp
  static_assert(RPC * CS == (G + 2) * HD && RPW * WARPS == RPC, "rows must split evenly over blocks and warps");
  __shared__ float qkv[(G + 2) * HD];                  // the KV head's G q heads, k, v: every block's rows, pushed
  __shared__ float pm[CS][G], pl[CS][G];               // block 0: every block's softmax partials, pushed
  __shared__ float wm[WARPS][G], wl[WARPS][G];         // this block's warps' partials
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = cluster.block_rank(), kvh = blockIdx.x / CS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.D / 8, d0 = lane * E;
  asm volatile("griddepcontrol.launch_dependents;");

  // Before the wait: what was written before this kernel began (weights, rotary row, older cache positions).
  extern __shared__ uint4 wsm[];                       // [RPC][NJ][32]: each thread reads back what it copied
  // Once the weights are read (before the first cluster barrier), their space holds the attention's partials.
  auto pacc = reinterpret_cast<float (*)[G][HD]>(wsm);                                    // [CS][G][HD]
  auto wacc = reinterpret_cast<float (*)[G][HD]>(reinterpret_cast<float *>(wsm) + CS * G * HD);   // [WARPS][G][HD]
  for (int r = 0; r < RPW; r++) {
    int lr = rank * RPC + warp * RPW + r, part = lr / HD;             // q head part < G, then k, then v
    int64_t row = part < G ? (int64_t)(kvh * G) * HD + lr : (int64_t)(part == G ? a.HQ + kvh : a.HQ + a.HKV + kvh) * HD + lr % HD;
    for (int j = 0; j < NJ; j++)
      if (j * 32 + lane < chunks && !(QA_PROBE & 4))
        cp16(&wsm[((warp * RPW + r) * NJ + j) * 32 + lane], (const uint16_t *)a.w + row * a.D + (j * 32 + lane) * 8);
  }
  asm volatile("cp.async.commit_group;");
  const int64_t pos = *a.pos;                          // set before the step began
  float cs[E], sn[E], qn[E], kn[E];
  for (int i = 0; i < E; i++) {
    cs[i] = get<T>(a.cos, pos * HD + d0 + i), sn[i] = get<T>(a.sin, pos * HD + d0 + i);
    qn[i] = a.qk_norm ? get<T>(a.qn, d0 + i) : 1.f, kn[i] = a.qk_norm ? get<T>(a.kn, d0 + i) : 1.f;
  }
  const int64_t cache = (int64_t)kvh * a.L * HD;
  // Positions rank, rank + CS, ... are this block's; warp w takes every WARPS-th of them, from its w-th.
  auto position = [&](int i) { return (int64_t)rank + (int64_t)CS * (warp + WARPS * i); };
  Vec<E> kpre[PRE] = {}, vpre[PRE] = {};
#pragma unroll
  for (int i = 0; i < PRE; i++)
    if (position(i) < pos) {
      kpre[i] = ldv<E>((const uint16_t *)a.kc + cache + position(i) * HD + d0);
      vpre[i] = ldv<E>((const uint16_t *)a.vc + cache + position(i) * HD + d0);
    }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the residual stream (or the token) is written
  uint4 g[NJ];                                          // the norm weights: beside the activations' loads
#pragma unroll
  for (int j = 0; j < NJ; j++)
    g[j] = j * 32 + lane < chunks ? ld16((const uint16_t *)a.g + (j * 32 + lane) * 8) : uint4{};

  // RMSNorm of the token's row (every warp reads the whole row), then this warp's rows, pushed to every block.
  const void *x = a.embed ? (const uint16_t *)a.x + *a.ids * a.D : a.x;
  float xn[NJ][8], ss = 0.f;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    uint4 v = j * 32 + lane < chunks ? ld16((const uint16_t *)x + (j * 32 + lane) * 8) : uint4{};
    if (a.embed && blockIdx.x == 0 && warp == 0 && j * 32 + lane < chunks)
      *reinterpret_cast<uint4 *>((uint16_t *)a.res + (j * 32 + lane) * 8) = v;
    const uint32_t *u = &v.x;
    for (int k = 0; k < 4; k++) {
      float2 f = pair(u[k], T());
      xn[j][2 * k] = f.x, xn[j][2 * k + 1] = f.y, ss += f.x * f.x + f.y * f.y;
    }
  }
  const float r = rsqrtf(warp_sum(ss) / a.D + a.eps);
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const uint32_t *u = &g[j].x;
    for (int k = 0; k < 4; k++) {
      float2 f = pair(u[k], T());
      xn[j][2 * k] = rnd(rnd(xn[j][2 * k] * r, T()) * f.x, T());
      xn[j][2 * k + 1] = rnd(rnd(xn[j][2 * k + 1] * r, T()) * f.y, T());
    }
  }
  float mine[RPW];
  if (!(QA_PROBE & 4)) asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    if (QA_PROBE & 4) { mine[r] = 0.f; continue; }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      uint4 wv = j * 32 + lane < chunks ? wsm[((warp * RPW + r) * NJ + j) * 32 + lane] : uint4{};
      const uint32_t *u = &wv.x;
      for (int k = 0; k < 4; k++) {
        float2 f = pair(u[k], T());
        s += f.x * xn[j][2 * k] + f.y * xn[j][2 * k + 1];
      }
    }
    mine[r] = rnd(warp_sum(s), T());
  }
  if (QA_PROBE & 1) {                                  // probe: this block's rows only, no exchange
    if (lane == 0)
      for (int r = 0; r < RPW; r++) qkv[rank * RPC + warp * RPW + r] = mine[r];
    __syncthreads();
  } else {
    if (lane < CS)                                     // lane c stores the warp's rows into block c
#pragma unroll
      for (int r = 0; r < RPW; r++) cluster.map_shared_rank(qkv, lane)[rank * RPC + warp * RPW + r] = mine[r];
    cluster.sync();                                    // every block holds the whole q, k, v
  }

  // q/k RMS norms (Qwen3), RoPE (rotate-half: dim d's partner d +- HD/2 is in lane ^ 16), the lane's E dims.
  float q[G][E], k[E], v[E];
  for (int i = 0; i < E; i++) {
    k[i] = qkv[G * HD + d0 + i], v[i] = qkv[(G + 1) * HD + d0 + i];
    for (int h = 0; h < G; h++) q[h][i] = qkv[h * HD + d0 + i];
  }
  const float sign = lane < 16 ? -1.f : 1.f;
  auto norm_rope = [&](float *y, const float *wn) {
    float sy = 0.f;
    for (int i = 0; i < E; i++) sy += y[i] * y[i];
    const float ry = rsqrtf(warp_sum(sy) / HD + a.eps);
    for (int i = 0; i < E; i++)
      if (a.qk_norm) y[i] = rnd(rnd(y[i] * ry, T()) * wn[i], T());
    for (int i = 0; i < E; i++) {
      float yr = __shfl_xor_sync(0xffffffffu, y[i], 16);
      y[i] = rnd(y[i] * cs[i] + sign * yr * sn[i], T());
    }
  };
  norm_rope(k, kn);
  for (int h = 0; h < G; h++) norm_rope(q[h], qn);
  if (rank == 0 && warp == 0)                          // block 0 caches the new position
    for (int i = 0; i < E; i++)
      put(a.kc, cache + pos * HD + d0 + i, k[i], T()), put(a.vc, cache + pos * HD + d0 + i, v[i], T());

  if (QA_PROBE & 2) {                                  // probe: no attention (q written as the output)
    if (rank == 0 && warp < G)
      for (int e = 0; e < E; e++) put(a.out, (kvh * G + warp) * HD + d0 + e, q[warp][e], T());
    return;
  }
  // This warp's positions (online softmax, every q head of the KV head), then the block's, pushed to block 0.
  Part<E> st[G];
  auto visit = [&](int64_t p, const Vec<E> &kt, const Vec<E> &vt) {
    float kv[E], vv[E];
    for (int e = 0; e < E / 2; e++) {
      float2 f = pair(kt.u[e], T()), b = pair(vt.u[e], T());
      kv[2 * e] = f.x, kv[2 * e + 1] = f.y, vv[2 * e] = b.x, vv[2 * e + 1] = b.y;
    }
    if (p == pos)                                      // the new position: this step's k, v (not read back)
      for (int e = 0; e < E; e++) kv[e] = k[e], vv[e] = v[e];
    for (int h = 0; h < G; h++) {
      float s = 0.f;
      for (int e = 0; e < E; e++) s += kv[e] * q[h][e];
      st[h].add(warp_sum(s) * a.scale, vv);
    }
  };
#pragma unroll
  for (int i = 0; i < PRE; i++)
    if (position(i) <= pos) visit(position(i), kpre[i], vpre[i]);
  for (int i = PRE; position(i) <= pos; i++)
    if (position(i) < pos) visit(position(i), ldv<E>((const uint16_t *)a.kc + cache + position(i) * HD + d0),
                                 ldv<E>((const uint16_t *)a.vc + cache + position(i) * HD + d0));
    else visit(position(i), Vec<E>{}, Vec<E>{});
  for (int h = 0; h < G; h++) {
    if (lane == 0) wm[warp][h] = st[h].m, wl[warp][h] = st[h].l;
    for (int e = 0; e < E; e++) wacc[warp][h][d0 + e] = st[h].acc[e];
  }
  __syncthreads();
  if (warp < G) {                                      // warp h: q head h's block partial, its warps in order
    const int h = warp;
    Part<E> b;
    for (int w2 = 0; w2 < WARPS; w2++) b.merge(wm[w2][h], wl[w2][h], &wacc[w2][h][d0]);
    if (lane == 0) cluster.map_shared_rank(&pm[0][0], 0)[rank * G + h] = b.m,
                   cluster.map_shared_rank(&pl[0][0], 0)[rank * G + h] = b.l;
    for (int e = 0; e < E; e++) cluster.map_shared_rank(&pacc[0][0][0], 0)[(rank * G + h) * HD + d0 + e] = b.acc[e];
  }
  cluster.sync();                                      // block 0 holds every block's partials
  if (rank == 0 && warp < G) {                         // combined in block order
    const int h = warp;
    Part<E> o;
    for (int c = 0; c < CS; c++) o.merge(pm[c][h], pl[c][h], &pacc[c][h][d0]);
    for (int e = 0; e < E; e++) put(a.out, (kvh * G + h) * HD + d0 + e, o.acc[e] / o.l, T());
  }
}

template <typename T, int HD, int G> constexpr int smem_bytes() { return (G + 2) * HD / CS * NJ * 32 * 16; }

template <typename T, int HD, int G> static cudaError_t prepare() {
  static cudaError_t e = [] {                          // clusters of 16 are beyond the portable 8
    cudaError_t e = cudaFuncSetAttribute(qkv_attention<T, HD, G>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (!e) e = cudaFuncSetAttribute(qkv_attention<T, HD, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     smem_bytes<T, HD, G>());
    const char *carve = getenv("QA_CARVEOUT");         // experiment: the shared-memory carveout, percent
    if (!e && carve) e = cudaFuncSetAttribute(qkv_attention<T, HD, G>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                              atoi(carve));
    return e;
  }();
  return e;
}

template <typename T, int HD, int G> static cudaLaunchConfig_t config(int blocks, cudaLaunchAttribute *at, int pdl) {
  cudaLaunchConfig_t cfg = {};
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = CS, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(THREADS), cfg.attrs = at, cfg.numAttrs = pdl ? 2 : 1;
  cfg.dynamicSmemBytes = smem_bytes<T, HD, G>();
  return cfg;
}

template <typename T, int HD, int G> static int launch_as(const Args *a, cudaStream_t stream) {
  if (cudaError_t e = prepare<T, HD, G>()) return e;
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg = config<T, HD, G>(a->HKV * CS, at, 1);
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, qkv_attention<T, HD, G>, *a);
}

template <typename T, int HD, int G> static int clusters_as(int *n) {
  if (cudaError_t e = prepare<T, HD, G>()) return e;
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg = config<T, HD, G>(16 * CS, at, 0);
  return cudaOccupancyMaxActiveClusters(n, qkv_attention<T, HD, G>, &cfg);
}

#define DISPATCH(F, ...)                                                                             \
  if (device >= 0) cudaSetDevice(device);                                                            \
  if (half == 0 && hd == 128 && g == 2) return F<__nv_bfloat16, 128, 2>(__VA_ARGS__);               \
  if (half == 0 && hd == 64 && g == 3) return F<__nv_bfloat16, 64, 3>(__VA_ARGS__);                 \
  if (half == 1 && hd == 128 && g == 2) return F<__half, 128, 2>(__VA_ARGS__);                      \
  if (half == 1 && hd == 64 && g == 3) return F<__half, 64, 3>(__VA_ARGS__);                        \
  return -1;

extern "C" {
// half: 0 bf16, 1 fp16; returns a cudaError_t (0: launched), or -1 for a shape without a kernel.
int qkv_attention_launch(const Args *a, int half, int hd, int g, void *stream, int device) {
  DISPATCH(launch_as, a, (cudaStream_t)stream)
}
// How many clusters can run at once on the device (cudaOccupancyMaxActiveClusters).
int qkv_attention_clusters(int half, int hd, int g, int device, int *n) { DISPATCH(clusters_as, n) }
const char *qkv_attention_error(int e) { return cudaGetErrorString((cudaError_t)e); }
int qkv_attention_args_size() { return sizeof(Args); }
}
