"""het's structure: no import cycle between its modules, nor between its packages, counting
every import statement (inside functions too) and modules imported by name (importlib).

The packages stand in layers, each importing only those below it:
config, staleness, process -> data, cache -> ps -> nn -> models -> dist -> train -> bench
-> serve, demo, cli.
"""

from __future__ import annotations

import ast
import itertools
import pathlib

import het

ROOT = pathlib.Path(het.__file__).parent


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The het modules ``name`` imports: every import statement, wherever it stands, and, in a
    module that calls ``importlib.import_module``, every string that names a het module."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    by_name = any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:  # `from het.ps import client` imports the module het.ps.client
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            out.add(node.value)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def package_of(module: str) -> str:
    """``het.train.loop`` -> ``het.train``; a top-level module (``het.config``) is its own."""
    return ".".join(module.split(".")[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = itertools.count()

    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_cycle():
    """The checker itself: a cycle through three nodes is found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_inside_functions_and_by_name_count(tmp_path):
    """An import inside a function and a module named to importlib are both edges."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from het.train import loop\n    import importlib\n"
                   "    importlib.import_module('het.bench.cache')\n")
    assert imports("het.x", src, known := modules()) == {"het.train.loop", "het.bench.cache"}
    src.write_text("import logging\nlog = logging.getLogger('het.ps')\n")  # a name, not an import
    assert imports("het.x", src, known) == set()


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


def test_no_import_cycle_between_packages():
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        if module == "het":  # the public API re-exports from every layer
            continue
        src = package_of(module)
        edges.setdefault(src, set()).update(package_of(t) for t in targets if package_of(t) not in (src, "het"))
    assert cycles(edges) == []
