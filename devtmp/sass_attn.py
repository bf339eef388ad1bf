"""Offline SASS of the draft's attention (decode_attention._decode_attention) for sm_90a, fp16 against bf16:
python devtmp/sass_attn.py OUT DTYPE [FOLD] (the h100 draft's shapes: 16 query heads, G 2, HD 128, S 16, P 64)."""
import sys, subprocess, tempfile, os
sys.path.insert(0, "/work/main")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lib.engine import decode_attention as A
out, dt = sys.argv[1], sys.argv[2]
fold = int(sys.argv[3]) if len(sys.argv) > 3 else 2
k = A._decode_attention
params = list(k.arg_names)
p = "*" + dt
sig = dict(qkv_ptr=p, qn_ptr=p, kn_ptr=p, cos_ptr=p, sin_ptr=p, kc_ptr=p, vc_ptr=p, pos_ptr="*i64", part_ptr="*fp32",
           ml_ptr="*fp32", count_ptr="*i32", out_ptr=p, eps="fp32", scale="fp32", P="i32", L="i32")
const = dict(HQ=16, G=2, HD=128, S=16, CH=32, NORM=True, PDL=True, ROW=0, FOLD=fold)
sig = {n: sig.get(n, "constexpr") for n in params}
div = [i for i, n in enumerate(params) if str(sig[n]).startswith("*") or n == "L"]
c = triton.compile(ASTSource(fn=k, signature=sig, constexprs={(params.index(n),): v for n, v in const.items()},
                             attrs={(i,): [["tt.divisibility", 16]] for i in div}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(c.asm["cubin"]); f.close()
nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
open(out, "w").write(subprocess.run([nv, "-c", f.name], capture_output=True, text=True).stdout)
open(out + ".ttgir", "w").write(c.asm["ttgir"])
cu = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
print(dt, "fold", fold, subprocess.run([cu, "-res-usage", f.name], capture_output=True, text=True).stdout.strip().splitlines()[-1])
