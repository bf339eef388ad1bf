"""Progress of the study's long loops, for the person watching `make reproduce`.

Under notebooks/run.py, $STUDY_PROGRESS names a file: every update appends one JSON line (a stage's done/total,
or a one-off note such as a resumed run), and the driver prints them in the terminal, so the executed notebooks
carry no progress bars. Elsewhere (JupyterLab, a script) a tqdm bar shows the same loop, and notes print."""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
EVERY_S = 0.5                     # the least time between two updates of one stage (the last always goes out)


def _emit(event: dict) -> bool:
    """Append one event to $STUDY_PROGRESS; False when no driver listens (none set, or its file out of reach: a
    Slurm shard on another node inherits the driver's path)."""
    path = os.environ.get("STUDY_PROGRESS")
    if not path:
        return False
    try:
        with open(path, "a") as f:
            f.write(json.dumps({**event, "time": time.time()}) + "\n")
    except OSError:
        return False
    return True


def note(message: str) -> None:
    """A one-off line for the terminal (and the notebook, where a reader wants it too)."""
    _emit({"note": message})
    print(message)


def steps(items: Iterable[T], stage: str, unit: str = "", before: int = 0,
          name: Callable[[T], str] | None = None) -> Iterator[T]:
    """Iterate over items, reporting `stage: done/total unit` as each one finishes; `before` items of the same
    stage were done earlier (a resumed run), so done counts from there and the total includes them. `name`
    (item -> str) marks items whose costs differ too much for an estimate of the time left (the int4 kernels: one
    builds for minutes at first use): each one's name is reported as it starts, and no estimate is made."""
    items = list(items)
    total = before + len(items)
    if not os.environ.get("STUDY_PROGRESS"):
        from tqdm import tqdm                     # interactive use; TQDM_DISABLE=1 hides it
        yield from tqdm(items, desc=stage, total=total, initial=before)
        return
    event = {"stage": stage, "done": before, "total": total, "unit": unit, "start": before}
    if name:
        event["uneven"] = True
    _emit(event)
    last = time.monotonic()
    for item in items:
        if name:
            _emit({**event, "now": name(item)})
        yield item
        event["done"] += 1
        if event["done"] == total or time.monotonic() - last >= EVERY_S:
            _emit(event)
            last = time.monotonic()
