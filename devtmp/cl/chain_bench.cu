// A chain of dependent kernels (programmatic dependent launch, CUDA graph): per-kernel time for plain launches and for
// thread-block-cluster launches of 8 and 16, with and without a cluster barrier inside. Fourteenth session, issue 25.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;

template <int SYNC> __global__ void step(int *buf, int i) {
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int v = buf[(i + blockIdx.x) % 64];
  if (SYNC) cg::this_cluster().sync();
  if (threadIdx.x == 0) buf[64 + blockIdx.x % 64] = v + 1;
}

template <int SYNC> float chain(int blocks, int threads, int cs, int pdl, int n, int *buf, cudaStream_t s) {
  cudaFuncSetAttribute(step<SYNC>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < n; i++) {
    cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute at[2]; int na = 0;
    if (cs > 1) { at[na].id = cudaLaunchAttributeClusterDimension; at[na].val.clusterDim = {(unsigned)cs, 1, 1}; na++; }
    if (pdl) { at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[na].val.programmaticStreamSerializationAllowed = 1; na++; }
    cfg.gridDim = blocks, cfg.blockDim = threads, cfg.stream = s, cfg.attrs = at, cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, step<SYNC>, buf, i);
    if (e) { printf("launch: %s\n", cudaGetErrorString(e)); }
  }
  cudaStreamEndCapture(s, &g);
  if (cudaGraphInstantiate(&ge, g, 0)) { printf("instantiate failed\n"); return -1; }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 5; w++) cudaGraphLaunch(ge, s);
  float best = 1e9;
  for (int r = 0; r < 20; r++) {
    cudaEventRecord(a, s); cudaGraphLaunch(ge, s); cudaEventRecord(b, s); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best;
  }
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return best * 1000 / n;
}

int main() {
  int *buf; cudaMalloc(&buf, 4096); cudaMemset(buf, 0, 4096);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int n = 280;
  struct { int blocks, threads, cs, sync; const char *what; } cases[] = {
      {1024, 32, 1, 0, "1024 blocks x 1 warp, no cluster (the Triton GEMVs' shape)"},
      {128, 128, 1, 0, "128 blocks x 4 warps, no cluster"},
      {128, 128, 8, 0, "128 blocks x 4 warps, clusters of 8"},
      {128, 128, 16, 0, "128 blocks x 4 warps, clusters of 16"},
      {128, 128, 8, 1, "128 blocks x 4 warps, clusters of 8, one cluster barrier"},
      {128, 128, 16, 1, "128 blocks x 4 warps, clusters of 16, one cluster barrier"},
      {128, 256, 8, 1, "128 blocks x 8 warps, clusters of 8, one cluster barrier"},
  };
  for (auto c : cases)
    for (int pdl = 0; pdl < 2; pdl++) {
      float us = c.sync ? chain<1>(c.blocks, c.threads, c.cs, pdl, n, buf, s) : chain<0>(c.blocks, c.threads, c.cs, pdl, n, buf, s);
      printf("%-62s pdl %d: %.2f us a kernel (best of 20 replays of %d)\n", c.what, pdl, us, n);
    }
  cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
}
