"""The target's append of a round's final token, inline (ordinary) or overlapped with the next proposals (pipelined):
on a GPU launched on the append's own CUDA stream, on a CPU run on a worker thread. lib/engine/rounds.py's loop
submits it and joins it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch


class Appender:
    """The target append of a round's final token (rule.append), run inline or overlapped (pipelined). On CUDA the
    overlapped append is launched from this thread on its own stream: a launch returns at once, so the host goes on to
    the next proposals, and no worker thread has to be scheduled (and take the GIL) before the append starts. A CPU
    computes as it goes, so there it runs on a worker thread. result() returns the pending prediction on the main
    stream."""

    def __init__(self, target, rule, pipelined: bool):
        self.target, self.rule, self.clock = target, rule, target.runner.clock
        cuda = target.runner.device.type == "cuda"
        self.stream = torch.cuda.Stream(target.runner.device) if pipelined and cuda else None
        self.pool = ThreadPoolExecutor(1) if pipelined and not cuda else None
        self.future, self.done, self.value, self.in_flight = None, None, None, False

    def submit(self, ids: torch.Tensor, start: int) -> None:
        self.in_flight = True
        if self.stream is not None:
            self.value, self.done = self._append_on_stream(ids, start)
        elif self.pool is not None:
            self.future = self.pool.submit(self._append_timed, ids, start)
        else:
            self.value = self._append_timed(ids, start)

    def _append_timed(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        with self.clock.span("finalize"):
            return self.rule.append(self.target, ids, start)

    def _append_on_stream(self, ids: torch.Tensor, start: int):
        ready = torch.cuda.Event()
        ready.record()                                                      # ids were written on the main stream
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            out = self._append_timed(ids, start)
            done = torch.cuda.Event()
            done.record()
        return out, done

    def result(self):
        self.in_flight = False
        if self.future is not None:
            out, self.future = self.future.result(), None
            return out
        if self.done is not None:                                           # the append's stream finished it
            torch.cuda.current_stream(self.target.runner.device).wait_event(self.done)
            self.done = None
        return self.value

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
