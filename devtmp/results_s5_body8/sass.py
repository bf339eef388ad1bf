import sys, importlib.util, re
sys.path.insert(0, "/work/main")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("dmod", sys.argv[1]); m = importlib.util.module_from_spec(spec)
sys.modules["dmod"] = m
src_text = open(sys.argv[1]).read().replace("from .kernels import", "from lib.engine.kernels import")
exec(compile(src_text, sys.argv[1], "exec"), m.__dict__)
sig = {n: "*bf16" for n in ["qkv_ptr","qn_ptr","kn_ptr","cos_ptr","sin_ptr","kc_ptr","vc_ptr"]}
sig.update(pos_ptr="*i64", part_ptr="*fp32", ml_ptr="*fp32", count_ptr="*i32", out_ptr="*bf16", eps="fp32", scale="fp32", L="i32")
params = list(m._decode_attention.arg_names)
if "pf_ptr" in params: sig.update(pf_ptr="*bf16", pf_bytes="i64")
const = dict(HQ=16, G=2, GP=1, HD=128, S=16, NS=22, NSP=32, NORM=True, PDL=True, PF=False)
const = {k: v for k, v in const.items() if k in params}
sig = {k: sig.get(k, "constexpr") for k in params}
c = triton.compile(ASTSource(fn=m._decode_attention, signature=sig, constexprs={(params.index(k),): v for k, v in const.items()}, attrs={(i,): [['tt.divisibility', 16]] for i, k in enumerate(params) if str(sig[k]).startswith('*')}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
import subprocess, tempfile, os
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(c.asm["cubin"]); f.close()
nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
sass = subprocess.run([nv, "-c", f.name], capture_output=True, text=True).stdout
lines = [l for l in sass.splitlines() if re.search(r"\b(LDG|STG|SHFL|ACQBULK|ATOM|BAR|DEPBAR|CCTL|MEMBAR)\b|griddep|ACQ", l)]
open(sys.argv[2], "w").write(sass)
