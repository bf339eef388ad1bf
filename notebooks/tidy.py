"""Keep notebooks diff-friendly. Always: drop widget state (progress-bar widgets and their ids) and
papermill's timing metadata. For the committed nbval references in notebooks/ also drop the outputs
nbval ignores, stderr and the injected-parameters cell, and write run names and commits as nbval's
sanitize.cfg reads them (e2e-RUN, commit HASH), so that re-executing them with no change changes no line;
executed notebooks under outputs/ keep all of it (keep_outputs=True, what notebooks/run.py does; from the
command line any notebook outside notebooks/ keeps it, so an executed result cannot lose its outputs).
Usage: python notebooks/tidy.py [--keep-outputs] notebooks/0*.ipynb"""
import argparse
import configparser
import re
from pathlib import Path

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def sanitizers() -> list[tuple[re.Pattern, str]]:
    """nbval's (regex, replacement) pairs from sanitize.cfg beside this file."""
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).with_name("sanitize.cfg"))
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def sanitize(text: str) -> str:
    for pattern, repl in sanitizers():
        text = pattern.sub(repl, text)
    return text


def is_widget(output) -> bool:
    return WIDGET_VIEW in output.get("data", {})


def merged_streams(outputs: list) -> list:
    """Adjacent stream outputs of one stream as one (the kernel splits a print's text at random points)."""
    out = []
    for o in outputs:
        if out and o.output_type == "stream" and out[-1].output_type == "stream" and out[-1].name == o.name:
            out[-1].text += o.text
        else:
            out.append(o)
    return out


def tidy(path, keep_outputs: bool = False) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = merged_streams([o for o in cell.outputs if not is_widget(o)])
        if keep_outputs:
            continue
        tags = cell.metadata.get("tags", [])
        if "nbval-ignore-output" in tags or "parameters" in tags or "injected-parameters" in tags:
            cell.outputs = []
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
        for o in cell.outputs:
            if o.output_type == "stream":
                o.text = sanitize(o.text)
            for mime in ("text/plain", "text/html"):
                if mime in o.get("data", {}):
                    o.data[mime] = sanitize(o.data[mime])
    if not keep_outputs:
        nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nbformat.write(nb, path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-outputs", action="store_true", help="executed notebooks: drop only widget state and timing")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent
    for p in args.paths:
        tidy(p, keep_outputs=args.keep_outputs or Path(p).resolve().parent != here)
