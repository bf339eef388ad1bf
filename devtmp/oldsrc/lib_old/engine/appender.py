"""The target's append of a round's final token, inline (ordinary) or overlapped with the next proposals on a
worker thread and its own CUDA stream (pipelined): lib/engine/rounds.py's loop submits it and joins it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch


class Appender:
    """The target append of a round's final token (rule.append), run inline or on a worker thread with its
    own CUDA stream (pipelined). result() returns the pending prediction on the main stream."""

    def __init__(self, target, rule, pipelined: bool):
        self.target, self.rule, self.clock = target, rule, target.runner.clock
        self.pool = ThreadPoolExecutor(1) if pipelined else None
        cuda = target.runner.device.type == "cuda"
        self.stream = torch.cuda.Stream(target.runner.device) if pipelined and cuda else None
        self.future, self.in_flight = None, False

    def submit(self, ids: torch.Tensor, start: int) -> None:
        self.in_flight = True
        if self.pool is None:
            with self.clock.span("finalize"):
                self.value = self.rule.append(self.target, ids, start)
            return
        ready = torch.cuda.Event() if self.stream is not None else None
        if ready is not None:
            ready.record()                                                  # ids were written on the main stream
        self.future = self.pool.submit(self._append_on_stream, ids, start, ready)

    def _append_on_stream(self, ids: torch.Tensor, start: int, ready):
        if self.stream is None:                                             # CPU: a thread, no stream
            with self.clock.span("finalize"):
                return self.rule.append(self.target, ids, start), None
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            with self.clock.span("finalize"):
                out = self.rule.append(self.target, ids, start)
            done = torch.cuda.Event()
            done.record()
        return out, done

    def result(self):
        self.in_flight = False
        if self.pool is None:
            return self.value
        out, done = self.future.result()
        if done is not None:                                                # the append's stream finished it
            torch.cuda.current_stream(self.target.runner.device).wait_event(done)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
