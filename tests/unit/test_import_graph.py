"""No import cycles among the modules of flashfleet_trainer and flashfleet_kernels.

The graph is read from the source with `ast` (nothing is imported): every `import` and
`from ... import` statement counts, at module level or inside a function, relative ones resolved
against the importing module's package. `from pkg import name` is an edge to `pkg.name` when that
is a module, else to `pkg` itself. A package's implicit import of its parent `__init__` is not an
edge (it is not something a module chose).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "trainer" / "flashfleet_trainer", ROOT / "kernels" / "flashfleet_kernels"]


def module_files(pkg_dirs) -> dict[str, Path]:
    """{dotted module name: file} for every .py under each package directory."""
    mods = {}
    for pkg in pkg_dirs:
        for f in sorted(pkg.rglob("*.py")):
            parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the modules of `mods` it imports}."""
    graph = {}
    for name, f in mods.items():
        is_pkg = f.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of an unknown tail: its known ancestor
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Iterative DFS with white/grey/black colouring."""
    colour = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the current path, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour.get(nxt, 2) == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt, 2) == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_cycle():
    graph = import_graph(module_files(PACKAGES))
    assert "flashfleet_trainer.cli" in graph and "flashfleet_kernels.reference" in graph
    assert "flashfleet_trainer.config" in graph["flashfleet_trainer.cli"]  # the graph has edges
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_of_the_trainer():
    """The entry decides, the node runs processes, a rank trains, a feed feeds: imports go downwards."""
    graph = import_graph(module_files(PACKAGES))
    importers = {m: {k for k, v in graph.items() if m in v} for m in graph}
    t = "flashfleet_trainer."
    assert importers[t + "planner"] == {t + "launch"}
    assert importers[t + "topology"] == {t + "launch"}
    assert importers[t + "launch"] == {t + "cli"}
    assert not graph[t + "feed"] & {t + "trainer", t + "topology", t + "planner", t + "launch"}
    assert not graph[t + "trainer"] & {t + "topology", t + "planner", t + "launch"}
    # a module that only raises or catches a run's errors imports errors, not the command line's parser
    assert not {m for m in graph[t + "errors"] if m.startswith(t)}
    # config is the command line: its parser's users (dflash-train's cli, dflash-eval in evaluate) and
    # parse_devices'; the modules handed the parsed settings import their type, RunConfig, from the plan
    assert importers[t + "config"] <= {t + "cli", t + "preflight", t + "vllm_target", t + "evaluate"}


def test_finds_a_cycle_through_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import x\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import os\nfrom ..a import y\n")
    (pkg / "d.py").write_text("from pkg.sub import c\n")
    graph = import_graph(module_files([pkg]))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(module_files([pkg]))) is None
