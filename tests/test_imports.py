"""Import structure, read from the source (nothing is imported): no cycle among ballast's
modules, whether the import sits at module level, inside a function or under TYPE_CHECKING; the
data pipeline below the layers that consume it; no bench script taking code from tests/."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ancestry(module: str) -> list[str]:
    """The module and every package above it: `a.b.c` -> a, a.b, a.b.c."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imported_modules(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules) -> set[str]:
    """The modules of `modules` an import statement of module `name` runs: the imported module
    and the packages above it; for `from X import y`, also X.y if it is a submodule. Packages
    above `name` are already initialised when it runs, so they count only when `name` takes a
    name from one of them (`from . import register`)."""
    above = set(ancestry(name))
    if isinstance(node, ast.Import):
        return ({m for alias in node.names for m in ancestry(alias.name)} - above) & modules
    base = node.module or ""
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
    runs = (set(ancestry(base)) - above) | submodules
    if len(submodules) < len(node.names):           # a name defined in X's __init__
        runs.add(base)
    return runs & modules


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, wherever the import sits: module level,
    inside a function, under `if TYPE_CHECKING:` (a module naming another's types in its
    annotations depends on it as much)."""
    files = {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                       for t in imported_modules(node, name, path.name == "__init__.py", set(files))}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component that holds a cycle (two or more modules, or one
    importing itself)."""
    return [c for c in strongly_connected(graph) if len(c) > 1 or c[0] in graph[c[0]]]


def shortest_cycle(graph: dict[str, set[str]], start: str) -> list[str]:
    """A shortest import chain from `start` back to itself (breadth first), `start` first."""
    came_from, frontier = {}, [start]
    while start not in came_from:
        assert frontier, f"{start} is on no cycle"
        step = []
        for v in frontier:
            for w in sorted(graph[v] - came_from.keys()):
                came_from[w] = v
                step.append(w)
        frontier = step
    path = [came_from[start]]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def chains(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through each module of a strongly connected component, each cycle once,
    as `a -> b -> a`."""
    found = {}
    for start in component:
        cycle = shortest_cycle(graph, start)
        first = cycle.index(min(cycle))                  # one rotation names one cycle
        cycle = cycle[first:] + cycle[:first]
        found[tuple(cycle)] = " -> ".join(cycle + cycle[:1])
    return list(found.values())


def test_graph_reader_sees_every_kind_of_import(tmp_path):
    # A package whose every cycle goes through a different kind of import: function-level,
    # `from . import submodule`, `from .pkg import name` (the package's __init__), absolute,
    # annotation-only; and a module that imports a submodule of a package and so its __init__.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    sources = {
        "__init__.py": "",
        "a.py": "def f():\n    from . import b\n",
        "b.py": "from .a import f\n",
        "c.py": "from .sub import thing\n",
        "sub/__init__.py": "from ..c import x\nthing = 1\n",
        "d.py": "import pkg.e\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n",
        "f.py": "from .f import y\n",
        "g.py": "from . import a, sub\n",
        "h.py": "from .sub import mod\nfrom pkg.sub.mod import z\n",
        "sub/mod.py": "",
    }
    for file, text in sources.items():
        (pkg / file).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.g"] == {"pkg.a", "pkg.sub"}     # submodules of its own package, not pkg
    assert graph["pkg.h"] == {"pkg.sub", "pkg.sub.mod"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub"], ["pkg.d", "pkg.e"], ["pkg.f"]]
    assert chains(graph, ["pkg.c", "pkg.sub"]) == ["pkg.c -> pkg.sub -> pkg.c"]


def test_no_import_cycle_among_ballast_modules():
    graph = import_graph(ROOT / "ballast")
    assert len(graph) > 100 and graph["ballast.planners.base"] >= {"ballast.pricing.cost", "ballast.plans.plan"}
    found = [chain for c in cycles(graph) for chain in chains(graph, c)]
    assert not found, "import cycles (a shortest one through each module on one):\n" + "\n".join(found)


# docs/design.md section 2: each layer's folder and what it may import of ballast. The planning
# core's three folders build on each other in one direction; the data pipeline knows samples,
# clips and model shapes, never the cluster, pricing, plans, models, runtime or the commands.
ALLOWED = {
    "ballast.vocabulary": (),
    "ballast.pricing": ("ballast.vocabulary",),
    "ballast.plans": ("ballast.vocabulary", "ballast.pricing"),
    "ballast.dataset": ("ballast.vocabulary.samples", "ballast.vocabulary.patterns",
                        "ballast.vocabulary.layouts", "ballast.vocabulary.clip",
                        "ballast.vocabulary.model_shape", "ballast.vocabulary.value_checks"),
}


def test_layers_import_only_the_layers_below():
    graph = import_graph(ROOT / "ballast")
    upward = sorted(f"{module} imports {target}" for module, targets in graph.items()
                    for layer, allowed in ALLOWED.items() if module == layer or module.startswith(layer + ".")
                    for target in targets
                    if target not in ("ballast", layer) and not target.startswith(layer + ".")
                    and not any(target in ancestry(a) or target.startswith(a + ".") for a in allowed))
    assert not upward, "\n".join(upward)


def test_bench_takes_nothing_from_tests():
    tests = ROOT / "tests"
    test_modules = {"tests"} | {p.stem for p in tests.rglob("*.py")}
    offences = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                offences += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in test_modules]
            if "sys.path" in ast.unparse(node) and isinstance(node, ast.Call) and "tests" in ast.unparse(node):
                offences.append(f"{path.name} puts tests/ on sys.path: {ast.unparse(node)}")
    assert not offences, "\n".join(offences)
