"""Device (thirty-second session): registers and spills of the draft attention kernels as compiled on the device
(its Triton), fp16 and bf16 drafts of the h100 pair after one fused step; their SASS instruction mix."""
import sys, os, subprocess, collections, re
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from dataclasses import replace
import torch, triton
from lib import modes
from lib.study import common
from lib.models import build
from lib.engine import decode_attention as A, decode as D
if os.environ.get("MOD") == "old":                 # the kernel before this session's fp16 widening
    import decode_attention_old as A
    D._decode_attention = A._decode_attention

print("triton", triton.__version__, flush=True)
P = common.setup("h100")
at = replace(P, decode=replace(P.decode, max_prompt_tokens=int(sys.argv[1]) if len(sys.argv) > 1 else 2048))
x = torch.zeros((1, 1), dtype=torch.long, device="cuda")
for dt in ("float16", "bfloat16"):
    d = build.build_drafts(replace(at, dtype=dt), [modes.DENSE])[modes.DENSE]
    d.runner.decode(x, torch.tensor(100, device="cuda"))
torch.cuda.synchronize()
for dev_cache in A._decode_attention.device_caches.values():
    for key, k in dev_cache[0].items():
        sig = str(key)[:160]
        print("kernel", "fp16" if "fp16" in sig else "bf16" if "bf16" in sig else "?", "regs", k.n_regs, "spills", k.n_spills,
              "shared", k.metadata.shared, flush=True)
        cub = "/tmp/k.cubin"
        open(cub, "wb").write(k.asm["cubin"])
        sass = subprocess.run(["cuobjdump", "-sass", cub], capture_output=True, text=True).stdout
        ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))
        print("   ", len(sass.splitlines()), "lines", dict(ops.most_common(16)), flush=True)
        name = "fp16" if "fp16" in sig else "bf16"
        open(os.path.join(os.environ.get("OUT", "/tmp"), f"attn_{os.environ.get('MOD', 'new')}_{name}_{k.n_regs}.sass"), "w").write(sass)
