"""The library's import graph (read with ast, function-level imports included): no module reaches itself
through its imports, so each can be read, tested and moved without the rest of the circle."""
import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"


def lib_imports(path: Path, modules: set[str]) -> set[str]:
    """The lib modules a module imports anywhere in its text (`from . import x`, `from .x import y`, `lib.x`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lib."):
            out.add(node.module.split(".")[1])
    return out & modules


def import_graph(lib: Path = LIB) -> dict[str, set[str]]:
    modules = {p.stem for p in lib.glob("*.py")}
    return {p.stem: lib_imports(p, modules) - {p.stem} for p in lib.glob("*.py")}


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


def test_the_circle_finder_finds_a_planted_circle(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import g\n")          # a function-level import counts
    (tmp_path / "c.py").write_text("from .a import x\n")
    (tmp_path / "d.py").write_text("from . import a\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert ["a", "b", "c", "a"] in circles(graph) and not [c for c in circles(graph) if c[0] == "d"]


def test_lib_has_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found[:5])
