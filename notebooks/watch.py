"""What the terminal shows while notebooks/run.py executes one notebook.

The notebook's kernel appends progress events to a file (lib/progress.py); a Watch reads them and prints:
in a terminal one status line rewritten every second, in a log (stdout not a terminal) plain lines whenever
a stage starts or ends and at least every `every` seconds. When nothing has been reported for `quiet_after`
seconds it says so, and names the cell papermill is running (from the staging notebook it saves at each cell).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path


def duration(seconds: float) -> str:
    """'42 s', '3 m 05 s', '1 h 02 m'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def running_cell(staging: Path) -> str:
    """The first line of the cell papermill marks as running in the staging notebook ('' if unknown)."""
    try:
        cells = json.loads(staging.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return ""
    for i, c in enumerate(cells):
        if c.get("metadata", {}).get("papermill", {}).get("status") == "running":
            src = "".join(c.get("source", "")).strip().splitlines()
            work = [ln for ln in src if not ln.startswith(("#", "from ", "import "))]   # the line that does the work
            first = (work or src or [""])[0]
            return f"cell {i}: {first[:70]}"
    return ""


class Watch:
    """Reads one notebook's progress file and renders it; poll(now) returns the lines to print (tested),
    run() prints them from a thread until stop()."""

    def __init__(self, label: str, events: Path, staging: Path, tty: bool | None = None, every: float = 30.0,
                 quiet_after: float = 60.0, clock=time.time, out=None):
        self.label, self.events, self.staging = label, Path(events), Path(staging)
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.every, self.quiet_after, self.clock = every, quiet_after, clock
        self.start = self.last_event = self.last_print = clock()
        self.offset, self.state, self.stage_start = 0, None, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, daemon=True)

    def read(self) -> list[dict]:
        """The events appended since the last read (whole lines only)."""
        try:
            with open(self.events) as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[:chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def status(self, now: float) -> str:
        """The status line: the current stage, how far, how long, about how long left, or what it waits on."""
        line = f"{self.label}: {duration(now - self.start)}"
        if self.state:
            s = self.state
            finished = s["done"] >= s["total"]                 # a finished stage keeps the time it took
            took = (s.get("time", now) if finished else now) - self.stage_start[s["stage"]]
            line += f" · {s['stage']}: {s['done']}/{s['total']} {s['unit']}".rstrip() + \
                (f", done in {duration(took)}" if finished else f", {duration(took)}")
            if s.get("now") and not finished:
                line += f", now {s['now']}"
            ran = s["done"] - s.get("start", 0)                # this run's share (a resumed run did the rest earlier)
            if 0 < ran and s["done"] < s["total"] and not s.get("uneven"):
                line += f", about {duration(took / ran * (s['total'] - s['done']))} left"
        if now - self.last_event >= self.quiet_after:
            cell = running_cell(self.staging)
            line += f" · nothing reported for {duration(now - self.last_event)}" + (f"; running {cell}" if cell else "")
        return line

    def poll(self, now: float | None = None) -> tuple[list[str], str | None]:
        """The notes that arrived since the last poll, and the status line when it is due (always in a terminal)."""
        now = self.clock() if now is None else now
        notes, changed = [], False
        for e in self.read():
            self.last_event = now
            if "note" in e:
                notes.append(f"{self.label}: {e['note']}")
                continue
            if e["stage"] not in self.stage_start:
                self.stage_start[e["stage"]] = e.get("time", now)
                changed = True
            changed |= e["done"] == e["total"]
            self.state = e
        quiet = now - self.last_event >= self.quiet_after and now - self.last_print >= self.quiet_after
        due = self.tty or changed or quiet or now - self.last_print >= self.every
        if due or notes:
            self.last_print = now
        return notes, self.status(now) if due else None

    def show(self, notes: list[str], status: str | None) -> None:
        if self.tty:                                          # notes above, the status line rewritten in place
            self.out.write("".join("\r\033[K" + line + "\n" for line in notes))
            if status:
                self.out.write("\r\033[K" + status[:max(20, _columns() - 1)])
        else:
            self.out.write("".join(line + "\n" for line in notes + ([status] if status else [])))
        self.out.flush()

    def run(self) -> None:
        while not self._stop.wait(1.0):
            self.show(*self.poll())
        notes, status = self.poll()                           # what came with the last events
        self.show(notes, None if self.tty else status)
        if self.tty:
            self.out.write("\r\033[K")
            self.out.flush()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _columns() -> int:
    import shutil
    return shutil.get_terminal_size((100, 20)).columns
