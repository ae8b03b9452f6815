"""The package's layers (docs/design.md): no module imports one that imports
it back, however indirectly, and the problems never import an engine.

Every import counts, a function's lazy one too: a circle hidden in a
function body still ties the two files together."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "monsoon"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set) -> set:
    """The package's modules that ``path`` (module ``name``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # "from . import x" imports the module x where there is one
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not (path.name == "__init__.py"
                                                  and target.startswith(name + ".")):
                found.add(target)
    return found


def _graph() -> dict:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    # a package's own __init__ is not an edge: importing a submodule runs it anyway
    return {name: {t for t in _imports(path, name, modules) if not name.startswith(t + ".")}
            for name, path in files.items()}


def _circles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back():
    assert _circles(_graph()) == []


def test_the_circle_finder_sees_a_lazy_import_back():
    graph = _graph()
    graph["monsoon.problems.torch_model"] = graph["monsoon.problems.torch_model"] | {
        "monsoon.problems.dataset_problem"}
    assert ["monsoon.problems.dataset_problem",
            "monsoon.problems.torch_model"] in _circles(graph)


def test_the_problems_never_import_an_engine():
    graph = _graph()
    assert {(m, t) for m, targets in graph.items() if m.startswith("monsoon.problems")
            for t in targets if t.startswith("monsoon.engines")} == set()


def test_no_function_under_engines_is_longer_than_80_lines():
    """An engine's steps stay small enough to read (issue 47): a longer
    function is split where its parts have names."""
    long = []
    for path in (PACKAGE / "engines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines})")
    assert long == []
