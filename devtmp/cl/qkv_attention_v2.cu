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

namespace cg = cooperative_groups;

constexpr int WARPS = 8, THREADS = 32 * WARPS, SPLIT = 16, NJ = 4, PRE = 2;   // NJ * 256: the largest hidden size

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
  int D, HQ, HKV, L, qk_norm, embed, probe;
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

// Weights copied to shared memory without passing through registers (two blocks an SM fit), issued before the wait.
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

template <typename T, int HD, int CS>
__global__ void __launch_bounds__(THREADS, 2) qkv_attention(const Args a) {
  constexpr int E = HD / 32, RPC = 3 * HD / CS, RPW = RPC / WARPS;   // lane's head dims; rows a block, a warp
  static_assert(RPC * CS == 3 * HD && RPW * WARPS == RPC, "rows must split evenly over blocks and warps");
  __shared__ float rows[RPC];                          // this block's q/k/v values, rounded to the dtype
  __shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][HD];   // the warps' softmax partials, then the block's in [0]
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = cluster.block_rank(), head = blockIdx.x / CS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = head / (a.HQ / a.HKV), chunks = a.D / 8;
  asm volatile("griddepcontrol.launch_dependents;");

  // Before the wait: what was written before this kernel began.
  extern __shared__ uint4 wsm[];                       // [RPC][NJ][32]: each thread reads back what it copied
  uint4 g[NJ];
  for (int r = 0; r < RPW; r++) {
    int lr = rank * RPC + warp * RPW + r, part = lr / HD;             // q, k or v row lr % HD of this head
    int64_t row = part == 0 ? head * HD + lr : (part == 1 ? a.HQ + kvh : a.HQ + a.HKV + kvh) * HD + lr % HD;
    for (int j = 0; j < NJ; j++)
      if (j * 32 + lane < chunks && !(a.probe & 1))
        cp16(&wsm[((warp * RPW + r) * NJ + j) * 32 + lane], (const uint16_t *)a.w + row * a.D + (j * 32 + lane) * 8);
  }
  asm volatile("cp.async.commit_group;");
  for (int j = 0; j < NJ; j++)
    g[j] = j * 32 + lane < chunks ? ld16((const uint16_t *)a.g + (j * 32 + lane) * 8) : uint4{};
  const int64_t pos = *a.pos;                          // set before the step began
  const int d0 = lane * E;
  float cs[E], sn[E], qn[E], kn[E];
  for (int i = 0; i < E; i++) {
    cs[i] = get<T>(a.cos, pos * HD + d0 + i), sn[i] = get<T>(a.sin, pos * HD + d0 + i);
    qn[i] = a.qk_norm ? get<T>(a.qn, d0 + i) : 1.f, kn[i] = a.qk_norm ? get<T>(a.kn, d0 + i) : 1.f;
  }
  const int64_t cache = (int64_t)kvh * a.L * HD;
  Vec<E> kpre[PRE][2] = {}, vpre[PRE][2] = {};         // the first PRE splits' older positions of this warp
#pragma unroll
  for (int i = 0; i < PRE; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int64_t p = (int64_t)(rank + i * CS) * SPLIT + warp + h * WARPS;
      if (p < pos) {
        kpre[i][h] = ldv<E>((const uint16_t *)a.kc + cache + p * HD + d0);
        vpre[i][h] = ldv<E>((const uint16_t *)a.vc + cache + p * HD + d0);
      }
    }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the residual stream (or the token) is written

  // RMSNorm of the token's row (every warp reads the whole row), then this warp's q/k/v rows.
  const void *x = a.embed ? (const uint16_t *)a.x + *a.ids * a.D : a.x;
  float xn[NJ][8], ss = 0.f;
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
  for (int j = 0; j < NJ; j++) {
    const uint32_t *u = &g[j].x;
    for (int k = 0; k < 4; k++) {
      float2 f = pair(u[k], T());
      xn[j][2 * k] = rnd(rnd(xn[j][2 * k] * r, T()) * f.x, T());
      xn[j][2 * k + 1] = rnd(rnd(xn[j][2 * k + 1] * r, T()) * f.y, T());
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  for (int r = 0; r < RPW; r++) {
    float s = 0.f;
    for (int j = 0; j < NJ; j++) {
      if (j * 32 + lane >= chunks) break;
      uint4 wv = (a.probe & 1) ? uint4{} : wsm[((warp * RPW + r) * NJ + j) * 32 + lane];
      const uint32_t *u = &wv.x;
      for (int k = 0; k < 4; k++) {
        float2 f = pair(u[k], T());
        s += f.x * xn[j][2 * k] + f.y * xn[j][2 * k + 1];
      }
    }
    s = warp_sum(s);
    if (lane == 0) rows[warp * RPW + r] = rnd(s, T());
  }
  cluster.sync();                                      // every block's rows are in its shared memory

  // The head's q, k, v (the lane's E dims of each) from the blocks that computed them.
  float q[E], k[E], v[E];
  for (int i = 0; i < E; i++) {
    int lq = d0 + i, lk = HD + d0 + i, lv = 2 * HD + d0 + i;
    if (a.probe & 4) { q[i] = rows[lq % RPC], k[i] = rows[lk % RPC], v[i] = rows[lv % RPC]; continue; }
    q[i] = cluster.map_shared_rank(rows, lq / RPC)[lq % RPC];
    k[i] = cluster.map_shared_rank(rows, lk / RPC)[lk % RPC];
    v[i] = cluster.map_shared_rank(rows, lv / RPC)[lv % RPC];
  }
  float sq = 0.f, sk = 0.f;                            // q/k RMS norms (Qwen3), then RoPE (rotate-half)
  for (int i = 0; i < E; i++) sq += q[i] * q[i], sk += k[i] * k[i];
  const float rq = rsqrtf(warp_sum(sq) / HD + a.eps), rk = rsqrtf(warp_sum(sk) / HD + a.eps);
  for (int i = 0; i < E; i++)
    if (a.qk_norm) q[i] = rnd(rnd(q[i] * rq, T()) * qn[i], T()), k[i] = rnd(rnd(k[i] * rk, T()) * kn[i], T());
  const float sign = lane < 16 ? -1.f : 1.f;           // dim d's rotate-half partner d +- HD/2 is in lane ^ 16
  for (int i = 0; i < E; i++) {
    float qr = __shfl_xor_sync(0xffffffffu, q[i], 16), kr = __shfl_xor_sync(0xffffffffu, k[i], 16);
    q[i] = rnd(q[i] * cs[i] + sign * qr * sn[i], T()), k[i] = rnd(k[i] * cs[i] + sign * kr * sn[i], T());
  }
  if (head % (a.HQ / a.HKV) == 0 && rank == 0 && warp == 0)     // the first query head of the KV head caches them
    for (int i = 0; i < E; i++)
      put(a.kc, cache + pos * HD + d0 + i, k[i], T()), put(a.vc, cache + pos * HD + d0 + i, v[i], T());

  if (a.probe & 2) {
    if (rank == 0 && warp == 0)
      for (int e = 0; e < E; e++) put(a.out, head * HD + d0 + e, q[e], T());
    cluster.sync();
    return;
  }
  // Splits rank, rank + CS, ... up to the position; warp w takes positions w and w + 8 of each.
  Part<E> st;
  auto visit = [&](int64_t p, const Vec<E> &kt, const Vec<E> &vt) {
    float kv[E], vv[E];
    for (int e = 0; e < E / 2; e++) {
      float2 f = pair(kt.u[e], T()), b = pair(vt.u[e], T());
      kv[2 * e] = f.x, kv[2 * e + 1] = f.y, vv[2 * e] = b.x, vv[2 * e + 1] = b.y;
    }
    if (p == pos)                                      // the new position: this step's k, v (not yet cached)
      for (int e = 0; e < E; e++) kv[e] = k[e], vv[e] = v[e];
    float s = 0.f;
    for (int e = 0; e < E; e++) s += kv[e] * q[e];
    st.add(warp_sum(s) * a.scale, vv);
  };
#pragma unroll
  for (int i = 0; i < PRE; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int64_t p = (int64_t)(rank + i * CS) * SPLIT + warp + h * WARPS;
      if (p <= pos) visit(p, kpre[i][h], vpre[i][h]);
    }
  for (int i = PRE; (int64_t)(rank + i * CS) * SPLIT <= pos; i++)
    for (int h = 0; h < 2; h++) {
      int64_t p = (int64_t)(rank + i * CS) * SPLIT + warp + h * WARPS;
      if (p < pos) visit(p, ldv<E>((const uint16_t *)a.kc + cache + p * HD + d0),
                         ldv<E>((const uint16_t *)a.vc + cache + p * HD + d0));
      else if (p == pos) visit(p, Vec<E>{}, Vec<E>{});
    }
  if (lane == 0) wm[warp] = st.m, wl[warp] = st.l;
  for (int e = 0; e < E; e++) wacc[warp][d0 + e] = st.acc[e];
  __syncthreads();
  if (warp == 0) {                                     // the block's partial: its warps in order
    Part<E> b;
    for (int w2 = 0; w2 < WARPS; w2++) b.merge(wm[w2], wl[w2], &wacc[w2][d0]);
    __syncwarp();
    if (lane == 0) wm[0] = b.m, wl[0] = b.l;
    for (int e = 0; e < E; e++) wacc[0][d0 + e] = b.acc[e];
  }
  cluster.sync();                                      // every block's partial is in its shared memory
  if (rank == 0 && warp == 0) {                        // block 0 combines the blocks in order
    Part<E> o;
    for (int c = 0; c < CS; c++) {
      float *m = cluster.map_shared_rank(wm, c), *l = cluster.map_shared_rank(wl, c);
      float acc[E];
      for (int e = 0; e < E; e++) acc[e] = cluster.map_shared_rank(&wacc[0][0], c)[d0 + e];
      o.merge(m[0], l[0], acc);
    }
    for (int e = 0; e < E; e++) put(a.out, head * HD + d0 + e, o.acc[e] / o.l, T());
  }
  cluster.sync();                                      // block 0 has read the others' shared memory
}

template <typename T, int HD, int CS> constexpr int smem_bytes() { return 3 * HD / CS * NJ * 32 * 16; }

template <typename T, int HD, int CS> static cudaError_t prepare() {
  static cudaError_t e = [] {                          // clusters of 16 are beyond the portable 8
    cudaError_t e = cudaFuncSetAttribute(qkv_attention<T, HD, CS>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e ? e : cudaFuncSetAttribute(qkv_attention<T, HD, CS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_bytes<T, HD, CS>());
  }();
  return e;
}

template <typename T, int HD, int CS> static int launch_as(const Args *a, cudaStream_t stream) {
  if (cudaError_t e = prepare<T, HD, CS>()) return e;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = CS, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(a->HQ * CS), cfg.blockDim = dim3(THREADS), cfg.stream = stream, cfg.attrs = at, cfg.numAttrs = 2;
  cfg.dynamicSmemBytes = smem_bytes<T, HD, CS>();
  return cudaLaunchKernelEx(&cfg, qkv_attention<T, HD, CS>, *a);
}

template <typename T, int HD, int CS> static int clusters_as(int *n) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = CS, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(16 * CS), cfg.blockDim = dim3(THREADS), cfg.attrs = at, cfg.numAttrs = 1;
  cfg.dynamicSmemBytes = smem_bytes<T, HD, CS>();
  cudaError_t e = prepare<T, HD, CS>();
  return e != cudaSuccess ? e : cudaOccupancyMaxActiveClusters(n, qkv_attention<T, HD, CS>, &cfg);
}

#define DISPATCH(F, ...)                                                                             \
  if (device >= 0) cudaSetDevice(device);                                                            \
  if (half == 0 && hd == 128 && cs == 8) return F<__nv_bfloat16, 128, 8>(__VA_ARGS__);              \
  if (half == 0 && hd == 128 && cs == 16) return F<__nv_bfloat16, 128, 16>(__VA_ARGS__);            \
  if (half == 0 && hd == 64 && cs == 8) return F<__nv_bfloat16, 64, 8>(__VA_ARGS__);                \
  if (half == 1 && hd == 128 && cs == 8) return F<__half, 128, 8>(__VA_ARGS__);                     \
  if (half == 1 && hd == 128 && cs == 16) return F<__half, 128, 16>(__VA_ARGS__);                   \
  if (half == 1 && hd == 64 && cs == 8) return F<__half, 64, 8>(__VA_ARGS__);                       \
  return -1;

extern "C" {
// half: 0 bf16, 1 fp16; returns a cudaError_t (0: launched), or -1 for a shape without a kernel.
int qkv_attention_launch(const Args *a, int half, int hd, int cs, void *stream, int device) {
  DISPATCH(launch_as, a, (cudaStream_t)stream)
}
// How many clusters of cs blocks can run at once on the device (cudaOccupancyMaxActiveClusters).
int qkv_attention_clusters(int half, int hd, int cs, int device, int *n) { DISPATCH(clusters_as, n) }
const char *qkv_attention_error(int e) { return cudaGetErrorString((cudaError_t)e); }
int qkv_attention_args_size() { return sizeof(Args); }
}
