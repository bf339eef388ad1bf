"""A static-KV-cache runner over a loaded Hugging Face decoder's own modules (Qwen3 or Llama), with
CUDA-graph capture per call length and an optional torch.compile'd layer function."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..bench import NO_CLOCK, capture, on
from .layer import fuse_projections, layer_forward

# torch.compile of the layer function, scoped to these calls (no global setting is changed):
# inductor's coordinate-descent tuning took the draft step measured by notebook 02 on one H100 from 1.51 to
# 1.405 ms (outputs/h100/microbench.json) for ~9 s more compile; and since one compiled function serves every
# layer (a guard per layer module) and every call length, dynamo's recompile limits are raised while it runs.
COMPILE_OPTIONS = {"coordinate_descent_tuning": True}
RECOMPILE_LIMITS = {"cache_size_limit": 64, "accumulated_cache_size_limit": 512}
TRITON_LAYER_ROWS = 64   # longer calls (prefills): SDPA and norm modules (attention partials: rows x splits)
FILL_CHUNK = TRITON_LAYER_ROWS   # a draft's prompt goes into its cache in graph replays of up to this many tokens
WARM_DEVICES = ("cuda",)  # where kernels are built or loaded on first use (tests add "cpu" to run warm_prefill there)


class KVCache:
    """Keys and values of every layer at fixed positions: (layers, 1, Hkv, max_len, hd) each."""

    def __init__(self, n_layers: int, n_kv: int, max_len: int, head_dim: int, dtype, device):
        shape = (n_layers, 1, n_kv, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    def bytes_at(self, positions: int) -> int:
        """Bytes of keys and values a step reads at `positions` cached positions, every layer."""
        per_position = 2 * self.k[..., 0, :].numel() * self.k.element_size()
        return positions * per_position


@dataclass(frozen=True)
class Acceleration:
    """What a runner's calls are built with: CUDA graphs (ignored on a CPU), torch.compile of the layer,
    batch-invariant rows, the fused single-token step and the Triton layer kernels. rows > 0: every call of at most
    `rows` tokens runs padded to exactly `rows` rows, so every kernel (matmuls, attention, norms, the head) sees one
    shape and reduces each row in one order whatever the number of real rows: a verify call's logits are bitwise
    those of single-token calls at its positions. fused: single-token calls run lib/engine/decode.py's kernels where
    they can and pass the check against this module's reference path (Runner.decode_path says which path runs).
    triton_layers: calls of up to TRITON_LAYER_ROWS tokens attend and normalise through lib/engine/layer_kernels.py
    where it can run, else through SDPA over the whole cache and the model's norm modules (Runner.layer_path says
    which)."""
    graphs: bool = False
    compile: bool = False
    rows: int = 0
    fused: bool = False
    triton_layers: bool = False


class Runner:
    """Forward passes of a loaded decoder with a static KV cache, reusing the model's own modules.

    forward(ids (1,n), start) writes K/V at positions start..start+n-1 and returns final normed hidden
    states (1,n,d); greedy() adds the model's dense-head argmax. Positions are device tensors, so each
    call length n is captured once in a CUDA graph and replayed (graphs=True on CUDA); on a CPU the
    same code runs eagerly. n_layers < the model's depth runs an early-exit body (its first n_layers,
    then the final norm). Every call is recorded on `clock` as a span named after `role`. With accel.rows the
    calls are batch-invariant (Acceleration); the padding rows (ids -1, looked up as token 0) write K/V past the real
    ones, into positions the next real tokens overwrite before any query reads them (the cache has accel.rows spare
    positions), and through the Triton layer kernels attend nothing (in a long cache their attention was most of a
    one-token call's).
    """

    def __init__(self, model, max_len: int, accel: Acceleration = Acceleration(), role: str = "model",
                 n_layers: int | None = None, clock=NO_CLOCK):
        cfg = model.config
        self.model, self.body = model, model.model
        self.layers = self.body.layers[:n_layers] if n_layers else self.body.layers
        W = model.get_output_embeddings().weight
        self.device, self.dtype = W.device, W.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_len, self.rows = max_len, accel.rows
        self.cache = KVCache(len(self.layers), cfg.num_key_value_heads, max_len + self.rows, head_dim, self.dtype,
                             self.device)
        self.arange = torch.arange(max_len + self.rows, device=self.device)
        cos, sin = self.body.rotary_emb(torch.zeros(1, dtype=self.dtype, device=self.device), self.arange[None])
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)                # (max_len,hd)
        self.graphs = accel.graphs and self.device.type == "cuda"
        self._graphs: dict = {}
        self.fused = [fuse_projections(layer) for layer in self.layers]
        # One compiled layer function serves every layer (its weights are inputs), once per length n.
        # Quantised projections break the graph (see `project`): the pieces between them are compiled.
        whole = all(self.fused)
        self._layer = (torch.compile(layer_forward, fullgraph=whole, dynamic=False, options=COMPILE_OPTIONS)
                       if accel.compile else None)
        self.role, self.clock = role, clock
        self.kernels, self.layer_path = triton_layers(self) if accel.triton_layers else (None, "torch")
        self.decode = None                                                                  # the reference path first
        self.decode, self.decode_path = fused_decode(self) if accel.fused else (None, "reference")

    def _forward(self, ids: torch.Tensor, start: torch.Tensor, compiled: bool = True) -> torch.Tensor:
        n = ids.shape[1]
        if n <= 2 and self.decode is not None:          # the fused step; 2 tokens: a round's catch-up after a full
            return self.decode(ids, start)              # acceptance, each weight read once for both
        pos = start + self.arange[:n]                                                       # (n,)
        kernels = self.kernels if n <= TRITON_LAYER_ROWS else None
        if kernels:                             # their mask: each row's last position, -1 for a padding row (_run)
            mask = torch.where(ids[0] >= 0, pos, -1) if self.rows else pos
        else:
            mask = self.arange[None, :] <= pos[:, None]                                     # (n,max_len) causal
        x = self.body.embed_tokens(ids.clamp_min(0) if self.rows else ids)
        at = (pos, mask, self.cos[pos], self.sin[pos])                                      # cos, sin: (n,hd)
        compiled = compiled and self._layer is not None                                     # eager for any-length prefill
        fn = self._layer if compiled else layer_forward
        with torch._dynamo.config.patch(**RECOMPILE_LIMITS) if compiled else nullcontext():
            for i, layer in enumerate(self.layers):
                x = fn(layer, self.fused[i], x, at, self.cache.layer(i), kernels)
        return self.body.norm(x)

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        return (h[0] @ self.model.get_output_embeddings().weight.T).argmax(-1)              # (n,)

    def _step(self, kind: str, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """What one CUDA graph holds: the forward, plus the dense argmax for kind 'greedy'."""
        h = self._forward(ids, start)
        return h if kind == "hidden" else self._argmax(h)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """The prompt (1,n) at position 0, eagerly (any length): greedy token after each, (n,)."""
        with self.clock.span(f"call_{self.role}_prefill", self.device):
            return self._run("greedy", ids, 0, graph=False)

    @torch.no_grad()
    def fill(self, ids: torch.Tensor) -> None:
        """The prompt (1,n) into the cache at position 0 (a draft needs no token of its prompt) in graph replays of
        the captured lengths (fill_calls; build_engines captures FILL_CHUNK): a 124-token prompt in 2 replays of 1.6 ms
        for a 0.6B draft, not 18 of 7 tokens. A call longer than the rest of the prompt is padded with token 0: the
        padding's K/V land past the prompt, where the draft's next tokens overwrite them before any query reads them
        (as after a rejection). A call whose length has no graph runs eagerly: nothing is captured (or compiled)
        here."""
        lengths = {key[1] for key in self._graphs if key[0] == "hidden"}
        with self.clock.span(f"call_{self.role}_prefill", self.device):
            for s, m in fill_calls(ids.shape[1], lengths, self.max_len):
                part = ids[:, s:s + m]
                self._run("hidden", F.pad(part, (0, m - part.shape[1])), s, graph=self._length(m) in lengths)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, start: int, graph: bool = True) -> torch.Tensor:
        """Final normed hidden states (1,n,d) for ids (1,n) at positions start.. (writes the cache)."""
        with self.clock.span(f"call_{self.role}_body", self.device):
            return self._run("hidden", ids, start, graph)

    @torch.no_grad()
    def greedy(self, ids: torch.Tensor, start: int | torch.Tensor, graph: bool = True) -> torch.Tensor:
        """The model's own dense-head argmax after each of ids (1,n): (n,) on the device. start: as chain's."""
        with self.clock.span(f"call_{self.role}", self.device):
            return self._run("greedy", ids, start, graph)

    def _length(self, n: int) -> int:
        """The length a call of n tokens runs at: at least `rows` (batch-invariant calls pad to a fixed count)."""
        return self.rows if 0 < n < self.rows else n

    def _run(self, kind: str, ids: torch.Tensor, start: int | torch.Tensor, graph: bool) -> torch.Tensor:
        n, m = ids.shape[1], self._length(ids.shape[1])
        if not isinstance(start, torch.Tensor) and start + n > self.max_len:
            raise ValueError(f"KV cache of {self.max_len} positions cannot hold {start + n}")
        if m == n:
            return self._call(kind, ids, start, graph)
        out = self._call(kind, F.pad(ids, (0, m - n), value=-1), start, graph)          # batch-invariant: fixed rows
        return out[:, :n] if kind == "hidden" else out[:n]

    def _call(self, kind: str, ids: torch.Tensor, start: int | torch.Tensor, graph: bool) -> torch.Tensor:
        n = ids.shape[1]
        if not (graph and self.graphs):                                                     # eager, any n
            at = start if isinstance(start, torch.Tensor) else torch.tensor(start, device=self.device)
            h = self._forward(ids, at, compiled=False)
            return h if kind == "hidden" else self._argmax(h)
        with on(self.device):                                                               # graphs live on one GPU
            return _replay(self._graphs.get((kind, n)) or self._capture(kind, n), ids, start)

    def warm(self, kind: str, lengths) -> None:
        """Capture the graphs of these call lengths now (a no-op without graphs), so that none is captured
        inside a timed generation."""
        if self.graphs:
            with on(self.device):
                for n in sorted({self._length(n) for n in lengths}):                       # the lengths calls run at
                    self._graphs.get((kind, n)) or self._capture(kind, n)

    @torch.no_grad()
    def warm_prefill(self, lengths) -> None:
        """Run the eager prefill once at each of these prompt lengths (on CUDA; a no-op on a CPU), so that no timed
        prefill meets a kernel first: the Triton kernels specialise on a call's length (n % 16 == 0 compiles anew)
        and other libraries load kernels on first use; such a first use had put 1.0-2.4 s into one prefill of every
        GPU e2e run before (the prompt that first met it). Writes the cache a generation's prefill overwrites."""
        if self.device.type in WARM_DEVICES:
            for n in sorted(set(lengths)):
                self._run("greedy", torch.zeros(1, n, dtype=torch.long, device=self.device), 0, graph=False)

    def _capture(self, kind: str, n: int) -> dict:
        """Capture the call of length n."""
        ids, start = self._static(n)
        return self._keep((kind, n), lambda: self._step(kind, ids, start), ids, start, n)

    def chain(self, pick, ids: torch.Tensor, start: int | torch.Tensor, kk: int) -> torch.Tensor:
        """kk tokens from one CUDA-graph replay (graphs on CUDA; else call by call): ids (1,m) fed at `start`, then
        each token that pick (hidden state (1,d) -> token (1,)) chooses fed in turn (the last one is not fed).
        start: a host int, or a 0-dim device tensor (a position the host does not know yet; no host read here, and
        the bound is the caller's to check)."""
        m = ids.shape[1]
        if not isinstance(start, torch.Tensor):
            if start + m + kk - 1 > self.max_len:
                raise ValueError(f"KV cache of {self.max_len} positions cannot hold {start + m + kk - 1}")
            start = start if self.graphs else torch.tensor(start, device=self.device)
        if not self.graphs:
            return self._chain(pick, ids, start, kk)
        with self.clock.span(f"call_{self.role}_block", self.device), on(self.device):
            return _replay(self._graphs.get(("chain", id(pick), m, kk)) or self.warm_chain(pick, m, kk), ids, start)

    def warm_chain(self, pick, m: int, kk: int, decode=None) -> dict:
        """Capture the chain of m fed tokens and kk picks for `pick` (kept with its graph, so its id stays its own);
        `decode`: through this fused step instead of the runner's own (another instance of it, for timing)."""
        ids, start = self._static(m)
        installed, self.decode = self.decode, decode or self.decode
        try:
            with on(self.device):
                g = self._keep(("chain", id(pick), m, kk), lambda: self._chain(pick, ids, start, kk), ids, start,
                               m + kk)
        finally:
            self.decode = installed
        g["pick"] = pick
        return g

    def _chain(self, pick, ids: torch.Tensor, start: torch.Tensor, kk: int) -> torch.Tensor:
        m = ids.shape[1]
        starts = start + torch.cat([self.arange[:1], self.arange[m:m + kk - 1]])             # where each call feeds
        x, toks = ids, []
        for i in range(kk):
            toks.append(pick(self._forward(x, starts[i])[:, -1]).view(1))
            x = toks[-1].view(1, 1)
        return torch.cat(toks)

    def _static(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(1, n, dtype=torch.long, device=self.device),
                torch.zeros((), dtype=torch.long, device=self.device))

    @torch.no_grad()                                                                        # warm() captures too
    def _keep(self, key, fn, ids: torch.Tensor, start: torch.Tensor, n: int) -> dict:
        """Capture fn (graph inputs ids, start) as self._graphs[key]. Capturing runs it at position 0, writing up to
        n positions: they are put back, so a graph first captured in the middle of a generation leaves that
        generation's cache as it was."""
        kept = self.cache.k[..., :n, :].clone(), self.cache.v[..., :n, :].clone()
        graph, out = capture(fn)
        self.cache.k[..., :n, :], self.cache.v[..., :n, :] = kept                           # after the warm-up runs
        self._graphs[key] = dict(graph=graph, ids=ids, start=start, out=out)
        return self._graphs[key]


def fill_calls(n: int, lengths, room: int) -> list[tuple[int, int]]:
    """The calls (start, length) that put n prompt tokens into a cache of `room` positions through the captured call
    lengths: from each start the shortest length that holds the rest of the prompt, else the longest that fits (a
    call past the rest is padded: Runner.fill); where none fits, the rest in one eager call."""
    calls, s = [], 0
    while s < n:
        fits = sorted(m for m in lengths if s + m <= room)
        m = next((m for m in fits if m >= n - s), fits[-1] if fits else n - s)
        calls.append((s, m))
        s += m
    return calls


def _replay(g: dict, ids: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
    """Replay a captured call with its inputs set: ids, and start from the host or (a 0-dim tensor) the device."""
    g["ids"].copy_(ids)
    g["start"].copy_(start) if isinstance(start, torch.Tensor) else g["start"].fill_(start)       # no host read
    g["graph"].replay()
    return g["out"]


def fused_decode(runner: Runner) -> tuple:
    """(lib/engine/decode.py's FusedDecode for this runner, "fused"), or (None, "reference (why not)") where it
    cannot run or fails its check against the reference path."""
    try:
        from . import decode
    except ImportError as e:                                                                # no Triton
        return None, f"reference ({e})"
    why = decode.supported(runner)
    step = None if why else decode.FusedDecode(runner)
    why = why or decode.check(runner, step)
    return (None, f"reference ({why})") if why else (step, "fused")


def triton_layers(runner: Runner) -> tuple:
    """(lib/engine/layer_kernels.py's TritonLayer, "triton"), or (None, "torch (why not)") where it cannot run."""
    try:
        from . import layer_kernels
    except ImportError as e:                                                                # no Triton
        return None, f"torch ({e})"
    why = layer_kernels.supported(runner.device, runner.cache.k.shape[-1])
    return (None, f"torch ({why})") if why else (layer_kernels.TritonLayer, "triton")
