"""Keep committed notebooks diff-friendly: drop outputs nbval ignores, execution counts' noise and
papermill's timing metadata. Usage: python notebooks/tidy.py notebooks/*.ipynb"""
import sys

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        if "nbval-ignore-output" in tags or "parameters" in tags or "injected-parameters" in tags:
            cell.outputs = []
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nbformat.write(nb, path)
