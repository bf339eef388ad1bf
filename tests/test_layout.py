"""The library's shape, read from its text with ast (function-level imports included):
- no module reaches itself through its imports;
- every import points down a layer: the ground floor (lib/*.py) imports only the ground floor; lib/engine
  the ground floor; lib/models the engine and the ground floor; lib/report only the ground floor (it is a pure
  function of result files and never loads a model); lib/study anything;
- each notebook imports only its own step module, lib.study.<step> (and lib.config);
- no module over 350 lines, no function over 50 lines or over 7 parameters (Triton kernels excepted: their
  parameters are the pointers, strides and sizes the GPU program is launched with);
- every library file and `python -m lib...` command that the code and the docs name exists."""
import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"
LAYERS = {"": {""}, "engine": {"", "engine"}, "models": {"", "engine", "models"}, "report": {"", "report"},
          "study": {"", "engine", "models", "report", "study"}}
STEPS = {"01_reclustering": "reclustering", "02_microbench": "microbench", "03_speculative": "speculative",
         "04_analysis": "analysis"}


def module_name(path: Path, lib: Path) -> str:
    """'config', 'engine.runner', 'engine' (a package's __init__)."""
    parts = path.relative_to(lib).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lib_imports(path: Path, lib: Path, modules: set[str]) -> set[str]:
    """The lib modules a module imports anywhere in its text: relative imports resolved against its package,
    `lib.x.y` imports, and `from <package> import <module>`."""
    me = module_name(path, lib)
    package = me.split(".")[:-1] if path.name != "__init__.py" else me.split(".") if me else []
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            base = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").split(".")[0] == "lib":
            base = node.module.removeprefix("lib").removeprefix(".")
        else:
            continue
        for a in node.names:                                   # `from pkg import module` or `from module import name`
            sub = f"{base}.{a.name}" if base else a.name
            out.add(sub if sub in modules else base)
    return (out & modules) - {me}


def import_graph(lib: Path = LIB) -> dict[str, set[str]]:
    paths = [p for p in lib.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p, lib) for p in paths}
    return {module_name(p, lib): lib_imports(p, lib, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every module that reaches itself, with the path it takes back (depth-first search from each)."""
    found = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    found.append(path + [start])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def layer(module: str) -> str:
    """A module's package ('engine', ...), or '' for the ground floor (a top-level module)."""
    top = module.split(".")[0]
    return top if top in LAYERS else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} -> {n}" for m, deps in sorted(graph.items()) for n in sorted(deps) if layer(n) not in LAYERS[layer(m)]]


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_circle_finder_finds_a_planted_circle(tmp_path):
    lib = plant(tmp_path, {"a.py": "from . import b\n", "b.py": "def f():\n    from .c import g\n",
                           "c.py": "from .a import x\n", "d.py": "from . import a\n"})
    graph = import_graph(lib)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert ["a", "b", "c", "a"] in circles(graph) and not [c for c in circles(graph) if c[0] == "d"]


def test_the_layer_check_finds_planted_upward_imports(tmp_path):
    lib = plant(tmp_path, {"config.py": "", "engine/__init__.py": "", "engine/runner.py": "from ..config import x\n",
                           "models/__init__.py": "", "models/build.py": "from ..engine import runner\n",
                           "study/__init__.py": "", "study/steps.py": "from ..models.build import y\n",
                           "report/__init__.py": "", "report/tables.py": "from ..models import build\n",
                           "engine/heads.py": "def f():\n    from lib.study.steps import z\n"})
    graph = import_graph(lib)
    assert graph["models.build"] == {"engine.runner"} and graph["engine.runner"] == {"config"}
    assert upward_imports(graph) == ["engine.heads -> study.steps", "report.tables -> models.build"]


def test_lib_has_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found[:5])


def test_every_import_points_down_a_layer():
    assert not upward_imports(import_graph())


def notebook_imports(path: Path) -> set[str]:
    """Every module a notebook's code cells import (`from lib.study import x` counts as lib.study.x)."""
    out = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                out |= {f"{node.module}.{a.name}" if node.module in ("lib", "lib.study") else node.module
                        for a in node.names}
    return out


@pytest.mark.parametrize("notebook", sorted(STEPS))
def test_each_notebook_imports_only_its_step(notebook):
    ours = {m for m in notebook_imports(ROOT / "notebooks" / f"{notebook}.ipynb") if m.split(".")[0] == "lib"}
    assert ours <= {f"lib.study.{STEPS[notebook]}", "lib.config"}, ours


def too_long(lib: Path = LIB) -> list[str]:
    """Modules over 350 lines; functions over 50 lines or 7 parameters (Triton kernels excepted)."""
    out = []
    for path in sorted(p for p in lib.rglob("*.py") if "__pycache__" not in p.parts):
        text, name = path.read_text(), path.relative_to(lib)
        if len(text.splitlines()) > 350:
            out.append(f"{name}: {len(text.splitlines())} lines")
        for f in ast.walk(ast.parse(text)):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("jit" in ast.unparse(d) for d in f.decorator_list):
                continue
            a = f.args
            params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            params += [x.arg for x in (a.vararg, a.kwarg) if x]
            if f.end_lineno - f.lineno + 1 > 50 or len(params) > 7:
                out.append(f"{name}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines, {len(params)} parameters")
    return out


def test_the_size_check_finds_planted_long_code(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    lib = plant(tmp_path, {"a.py": f"def long():\n{body}\n\ndef wide(a, b, c, d, e, f, g, h):\n    pass\n\n\n"
                                   "@triton.jit\ndef kernel(a, b, c, d, e, f, g, h):\n    pass\n"})
    assert [s.split(" ", 1)[1] for s in too_long(lib)] == ["long: 51 lines, 0 parameters", "wide: 2 lines, 8 parameters"]


def test_modules_and_functions_stay_short():
    assert not too_long(), "\n".join(too_long())


def named_paths(text: str) -> set[str]:
    """The library's files and modules a text tells its reader to open or run: lib/... .py or .cu paths, and the
    modules of `python -m lib...` commands."""
    files = set(re.findall(r"(?<![\w/.])(lib/[\w/]+\.(?:py|cu))", text))
    modules = {m.replace(".", "/") + ".py" for m in re.findall(r"python3? -m (lib(?:\.\w+)+)", text)}
    return files | modules


def test_the_name_check_finds_planted_names():
    assert named_paths("see lib/engine/decode.py; run `python -m lib.study.preflight --claim`") == {
        "lib/engine/decode.py", "lib/study/preflight.py"}


def test_every_library_file_and_command_named_in_the_code_and_the_docs_exists():
    """A moved module leaves no error message, docstring, comment, notebook or README line pointing at its old
    place (`python -m lib.preflight` in the claim errors once did)."""
    texts = [*LIB.rglob("*.py"), *LIB.rglob("*.cu"), *(ROOT / "notebooks").glob("*.ipynb"),
             *(ROOT / "notebooks").glob("*.py"), *(ROOT / "params").glob("*.yaml"), ROOT / "README.md",
             ROOT / "Makefile"]
    missing = {f"{p.relative_to(ROOT)}: {name}" for p in texts for name in named_paths(p.read_text())
               if not (ROOT / name).exists()}
    assert not missing, sorted(missing)
