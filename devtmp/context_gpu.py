"""Device: notebook 03's context study alone for a profile (context.json), with its table."""
import sys, time, faulthandler
faulthandler.dump_traceback_later(int(sys.argv[2]) if len(sys.argv) > 2 else 150, repeat=True)
sys.path.insert(0, ".")
import pandas as pd
from lib.study import common
from lib.study.speculative import load_target
from lib.study.context_lengths import context_study
from lib.report.context import context_table
pd.set_option("display.width", 250); pd.set_option("display.max_columns", 30)
t0 = time.time()
P = common.setup(sys.argv[1])
target = load_target(P)
print("target loaded", round(time.time() - t0), type(target.model.layers[0].mlp.down_proj).__name__, flush=True)
c = context_study(P, target)
print("done", round(time.time() - t0), c["device"], c["draft_path"], c["copy_GBps"], flush=True)
print(context_table(c).round(4).T.to_string())
