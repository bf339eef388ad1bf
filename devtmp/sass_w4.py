import sys, re, subprocess, tempfile, os
sys.path.insert(0, "/work/main")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import lib.models.w4a16 as W
sys.path.insert(0, "/work/main/devtmp")

import importlib; V3 = importlib.import_module(os.environ.get("MOD", "w4a16_v3"))
k = getattr(V3, "_w4a16_kernel_" + sys.argv[5]) if len(sys.argv) > 5 else W._w4a16_kernel
if len(sys.argv) > 5 and sys.argv[5] == "zsword": sig0 = "*i32"
params = list(k.arg_names)
sig = dict(x_ptr="*fp16", w_ptr="*i32", g_ptr="*i32", z_ptr=globals().get("sig0", "*u8"), s_ptr="*fp16", part_ptr="*fp32", count_ptr="*i32", res_ptr="*fp16",
           out_ptr="*fp16", M="i32", N="i32", K="i32", stride_xm="i32", stride_w="i32", stride_g="i32", k_per_split="i32")
const = dict(BLOCK_N=int(sys.argv[2]), MAGIC=0x6400, SPLIT=os.environ.get("SPLIT", "1") == "1", RESIDUAL=False, EMULATE=False, GLU=os.environ.get("GLU", "0") == "1", PDL=os.environ.get("PDL", "1") == "1")
const = {n: v for n, v in const.items() if n in k.arg_names}
sig = {n: sig.get(n, "constexpr") for n in params}
div = [i for i, n in enumerate(params) if str(sig[n]).startswith("*") or n in ("N", "K", "stride_w", "stride_g", "k_per_split", "stride_xm")]
fn = k.fn if hasattr(k, "fn") else k
c = triton.compile(ASTSource(fn=k, signature=sig, constexprs={(params.index(n),): v for n, v in const.items()},
                             attrs={(i,): [["tt.divisibility", 16]] for i in div}),
                   target=GPUTarget("cuda", 90, 32), options=dict({"num_warps": int(sys.argv[3]), "num_stages": int(sys.argv[4])}, **({"maxnreg": int(os.environ["MAXNREG"])} if os.environ.get("MAXNREG") else {})))
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(c.asm["cubin"]); f.close()
nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
out = sys.argv[1]
open(out + ".ttgir", "w").write(c.asm["ttgir"])
open(out + ".ptx", "w").write(c.asm["ptx"])
open(out, "w").write(subprocess.run([nv, "-c", f.name], capture_output=True, text=True).stdout)
cu = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
print("shared", c.metadata.shared, subprocess.run([cu, "-res-usage", f.name], capture_output=True, text=True).stdout.strip().splitlines()[-1])
