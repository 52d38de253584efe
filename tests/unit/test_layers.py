"""het's structure: its packages stand in the layers declared below (the order
docs/ARCHITECTURE.md's "Layers" paragraph states), each importing only layers below its own
(the packages of one layer import none of each other), with no import cycle between modules
or packages; inside het.ps, the rooms of the parameter server stand in layers too (the store
and the wire side by side, neither importing the other).

Every import statement counts, wherever it stands: one inside a function (``het serve``'s, a
lazy import that keeps a command's start fast) is as much a dependency as one at the top, so it
must point down the order too. A module named to ``importlib.import_module`` counts as well.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
import re
import shutil
import subprocess
import sys

import het

ROOT = pathlib.Path(het.__file__).parent

# het's packages (and top-level modules), lowest layer first: a package imports only layers
# before its own. docs/ARCHITECTURE.md states the same order (checked below; ``python -m het``'s
# __main__, above everything, goes without saying there).
LAYERS = (
    ("staleness", "process", "memory", "native", "adagrad", "choices", "files", "schedule", "decay"),
    ("arrayfile", "lock", "settings"),
    ("optimizer",),
    ("config",),
    ("data", "cache"),
    ("ps",),
    ("nn",),
    ("models",),
    ("dist",),
    ("train",),
    ("export",),
    ("online",),
    ("bench",),
    ("serve", "demo"),
    ("cli",),
    ("__main__",),
)
# het.ps's sides, lowest first: what both share (the protocol), the worker's side (the client)
# and the shard's (the server) beside it, neither importing the other, and the ends above both:
# shards in this process behind a client, and the offline reshard tool.
PS_ROOMS = (
    ("protocol",),
    ("client", "server"),
    ("local", "reshard"),
)
# het.ps.server's rooms, lowest first: the stores, what the shard keeps beside them, the shard,
# and the server and process that put it behind a transport.
SERVER_ROOMS = (
    ("store",),
    ("budget", "changes", "hot", "metrics", "parts", "reads", "sessions"),
    ("shard",),
    ("server", "process"),
)


def modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
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
            for a in node.names:  # `from het.ps import client` imports the module het.ps.client.client
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            out.add(node.value)
    return {m for m in out if m in known and m != name}


def graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def package_of(module: str) -> str:
    """``het.train.loop`` -> ``het.train``; a top-level module (``het.config``) is its own."""
    return ".".join(module.split(".")[:2])


def room_of(module: str, depth: int = 2) -> str:
    """``het.ps.server.store.fixed`` -> ``server`` (``depth`` 3: ``store``); ``het.ps.local`` -> ``local``."""
    return module.split(".")[depth]


def against_order(edges: dict[str, set[str]], layers: tuple, part, within: str = "het") -> list[str]:
    """The imports that do not point down ``layers`` (up, or across one layer), among the
    modules under ``within`` (the package itself, whose ``__init__`` re-exports its public API
    from every layer, excepted; ``part``: the name a module's layer is found by; modules of one
    part import each other freely), as ``"importer -> imported (layer i -> j)"``; and
    ``"unplaced: name"`` for a part in no layer."""
    level = {name: i for i, layer in enumerate(layers) for name in layer}
    found = []
    for module, targets in sorted(edges.items()):
        if not module.startswith(within + "."):
            continue
        for target in sorted(t for t in targets if t.startswith(within + ".")):
            src, dst = part(module), part(target)
            for name in (src, dst):
                if name not in level:
                    found.append(f"unplaced: {name}")
            if src != dst and src in level and dst in level and level[dst] >= level[src]:
                found.append(f"{module} -> {target} (layer {level[src]} -> {level[dst]})")
    return sorted(set(found))


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports against :data:`LAYERS` between het's packages, against :data:`PS_ROOMS` inside
    het.ps and against :data:`SERVER_ROOMS` inside het.ps.server."""
    return (against_order(edges, LAYERS, lambda m: package_of(m).split(".")[1])
            + against_order(edges, PS_ROOMS, room_of, within="het.ps")
            + against_order(edges, SERVER_ROOMS, lambda m: room_of(m, 3), within="het.ps.server"))


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


def stated_layers(text: str) -> tuple:
    """The layer order a "Layers" paragraph states: the backquoted names between ``->``s of
    its first sentence that has them."""
    section = text.split("## Layers", 1)[1]
    order = re.search(r"((?:`[\w.]+`(?:,\s*|\s*->\s*))+`[\w.]+`)", section).group(1)
    return tuple(tuple(re.findall(r"`([\w.]+)`", layer)) for layer in order.split("->"))


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


def test_every_package_and_ps_room_has_a_layer():
    """A new package (or room of het.ps) is placed in the order before it is imported."""
    names = {package_of(m).split(".")[1] for m in modules() if m != "het"}
    assert names == {name for layer in LAYERS for name in layer}
    rooms = {room_of(m) for m in modules() if m.startswith("het.ps.")}
    assert rooms == {name for layer in PS_ROOMS for name in layer}
    rooms = {room_of(m, 3) for m in modules() if m.startswith("het.ps.server.")}
    assert rooms == {name for layer in SERVER_ROOMS for name in layer}


def test_the_architecture_states_the_declared_order():
    doc = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text()
    assert stated_layers(doc) == LAYERS[:-1]
    ps = doc.split("## Layers", 1)[1].split("het.ps", 1)[1]
    assert stated_layers("## Layers" + ps) == PS_ROOMS
    server = ps.split("het.ps.server", 1)[1]
    assert stated_layers("## Layers" + server) == SERVER_ROOMS


def test_no_import_against_the_layer_order():
    assert upward(graph()) == []


def test_a_planted_upward_import_fails_the_check(tmp_path):
    """The check itself, on a copy of het: an import of the training loop planted inside a
    function of the cache (a lazy import: it counts), one of the server planted in the client,
    one of the client in the server's store, one of the client in the protocol and one of the
    shard in the store are each found."""
    copy = tmp_path / "het"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("*.so", "*.cpu", "__pycache__"))
    assert upward(graph(copy)) == []
    plants = {"cache/cache.py": "\n\ndef _planted():\n    from het.train import loop\n",
              "ps/client/requests.py": "\nfrom het.ps.server import shard\n",
              "ps/server/store/fixed.py": "\nfrom het.ps.client import replies\nfrom het.ps.server import shard\n",
              "ps/protocol/messages.py": "\nfrom het.ps.client import connection\n"}
    for name, line in plants.items():
        (copy / name).write_text((copy / name).read_text() + line)
    assert upward(graph(copy)) == [
        "het.cache.cache -> het.train.loop (layer 4 -> 9)",
        "het.ps.client.requests -> het.ps.server.shard (layer 1 -> 1)",
        "het.ps.protocol.messages -> het.ps.client.connection (layer 0 -> 1)",
        "het.ps.server.store.fixed -> het.ps.client.replies (layer 1 -> 1)",
        "het.ps.server.store.fixed -> het.ps.server.shard (layer 0 -> 2)"]


def test_a_worker_loads_no_module_of_the_server():
    """What a training worker imports (its loop, het.Embedding, the command) loads the protocol
    and the client, and no module of het.ps.server."""
    code = ("import sys, het.train.cli, het.train.loop, het.nn.embedding\n"
            "print(sorted(m for m in sys.modules if m.startswith('het.ps.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "het.ps.client.client" in loaded and "het.ps.protocol.messages" in loaded
    assert "het.ps.server" not in loaded, loaded


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []
