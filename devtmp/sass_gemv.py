"""Offline SASS of the draft's GEMV (decode._decode_gemv) for sm_90a: python devtmp/sass_gemv.py OUT DTYPE NAME
(NAME: qkv, o, gate_up, down at the 0.6B draft's shapes, the library's warps and late set)."""
import sys, subprocess, tempfile, os
sys.path.insert(0, "/work/main")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lib.engine import decode as D
out, dt, name = sys.argv[1], sys.argv[2], sys.argv[3]
shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (3072, 1024), "down": (1024, 3072)}
N, K = shapes[name]
norm, glu, residual = D.GEMVS[name]
warps = int(os.environ.get("WARPS", D.GEMV_WARPS[name]))
late = int(os.environ.get("LATE", "1" if name in D.LATE_ACTIVATIONS else "0"))
bn = D._rows(K, D.TILE_BYTES * warps, 2, 2 if glu else 1)
k = D._decode_gemv
if os.environ.get("KERNEL") == "all":
    sys.path.insert(0, "/work/main/devtmp"); import gemv_lateall; k = gemv_lateall._decode_gemv_all
params = list(k.arg_names)
p = "*" + dt
sig = dict(x_ptr=p, g_ptr=p, w_ptr=p, out_ptr=p, ids_ptr=p, res_ptr=p, eps="fp32", N="i32")
const = dict(K=K, BK=triton.next_power_of_2(K), BN=bn, NORM=norm, GLU=glu, RESIDUAL=residual, EMBED=False, PDL=True,
             T=1, LATE=late)
sig = {n: sig.get(n, "constexpr") for n in params}
div = [i for i, n in enumerate(params) if str(sig[n]).startswith("*") or n == "N"]
c = triton.compile(ASTSource(fn=k, signature=sig, constexprs={(params.index(n),): v for n, v in const.items()},
                             attrs={(i,): [["tt.divisibility", 16]] for i in div}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(c.asm["cubin"]); f.close()
nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
open(out, "w").write(subprocess.run([nv, "-c", f.name], capture_output=True, text=True).stdout)
cu = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
print(name, dt, "warps", warps, "BN", bn, "late", late, subprocess.run([cu, "-res-usage", f.name], capture_output=True, text=True).stdout.strip().splitlines()[-1])
