"""The package's import graph: no cycle, and no module imports one from a higher layer (imports inside
functions count too: a lazy import is still a dependency). Run alone: python -m pytest tests/test_import_graph.py"""
import ast
import os

import giga_train

ROOT = os.path.dirname(giga_train.__file__)

# One line per folder, lowest first: a module may import its own layer and lower ones. The package root holds
# two lines: its base modules (imported by everyone) and its top (the CLI, the public API, GigaTrain's import
# paths giga_train.utils and giga_train.strategies, which re-export compat/).
LAYERS = {
    "(root base)": (0, ["errors", "config", "registry", "module_dict"]),
    "distributed": (1, ["distributed"]),
    "optimizers": (1, ["optimizers"]),
    "schedulers": (1, ["schedulers"]),
    "tracking": (1, ["tracking"]),
    "checkpoint": (2, ["checkpoint"]),
    "engine": (3, ["engine"]),
    "compat": (4, ["compat"]),
    "data": (5, ["data"]),
    "schema": (6, ["schema"]),
    "trainers": (7, ["trainers"]),
    "launch": (8, ["launch"]),
    "tools": (9, ["tools"]),
    "(root top)": (10, ["cli", "__main__", "__init__", "utils", "strategies"]),
}


def modules():
    """{dotted name relative to giga_train ('' parts joined by '.'): path}; a package's __init__ is its name."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, name)
    return found


def edges(found):
    graph = {}
    for name, path in found.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package != "__init__" else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                stem = ".".join([p for p in base if p] + ([node.module] if node.module else []))
                candidates = [f"{stem}.{a.name}" if stem else a.name for a in node.names] + [stem]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("giga_train"):
                stem = node.module[len("giga_train."):] if node.module != "giga_train" else ""
                candidates = [f"{stem}.{a.name}" if stem else a.name for a in node.names] + [stem]
            elif isinstance(node, ast.Import):
                candidates = [a.name[len("giga_train."):] for a in node.names if a.name.startswith("giga_train.")]
            else:
                continue
            hit = next((c for c in candidates if c in found), None)
            if hit and hit != name:
                targets.add(hit)
        graph[name] = targets
    return graph


def layer(name):
    for level, prefixes in LAYERS.values():
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return level
    raise AssertionError(f"giga_train.{name} is in no layer: add its folder to LAYERS")


def test_no_module_imports_a_higher_layer():
    graph = edges(modules())
    upward = [f"{a} (layer {layer(a)}) -> {b} (layer {layer(b)})" for a, targets in graph.items()
              for b in targets if layer(b) > layer(a)]
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_cycle():
    graph = edges(modules())
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_edges():
    """The graph is not empty by accident: known edges are found (a relative and a lazy import)."""
    graph = edges(modules())
    assert "errors" in graph["config"] and "checkpoint.checkpointer" in graph["trainers.building"]
    assert "checkpoint.formats.full_state" in graph["tools.convert"]  # imported inside a function


def test_every_folder_is_one_layer_line():
    """Each folder of the package appears in LAYERS as one line of its own, and nothing else does."""
    folders = {name.split(".")[0] for name in modules() if "." in name}
    listed = {key for key in LAYERS if not key.startswith("(")}
    assert folders - {"strategies"} == listed, (folders, listed)
