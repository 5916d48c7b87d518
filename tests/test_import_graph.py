"""The package's import graph: no cycle, and no module imports one from a higher layer (imports inside
functions count too: a lazy import is still a dependency). Run alone: python -m pytest tests/test_import_graph.py"""
import ast
import os

import giga_train

ROOT = os.path.dirname(giga_train.__file__)

# Lowest first. A module belongs to the longest prefix listed; it may import its own layer and lower ones.
LAYERS = [
    ["errors"],
    ["config", "registry", "module_dict", "precision", "blocks", "utils", "ssh", "checks"],
    # distributed.deepspeed_config: a pure config resolver (the schema checks DeepSpeed JSON with it)
    ["schema", "schema_keys", "schema_launch", "schema_train", "schema_loader", "schema_accelerate", "schema_data",
     "compile", "fp8", "ema", "schedulers", "optimizers", "data", "tracking",
     "distributed.deepspeed_config",
     "strategies"],  # giga_train.strategies: GigaTrain's import paths for EMAModel & co.
    ["checkpoint"],
    ["distributed"],
    ["trainers"],
    # offline, memory_counts, plan, export: the config's Trainer hooks without a run (giga-train plan / export)
    ["runners", "offline", "memory_counts", "plan", "export", "distributed.launch", "distributed.worker", "cli",
     "__main__", "__init__"],
]


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
    best, level = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"giga_train.{name} is in no layer: add it to LAYERS"
    return level


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
    assert "errors" in graph["config"] and "checkpoint.checkpointer" in graph["trainers.trainer"]
    assert "checkpoint.portable" in graph["checkpoint.convert"]  # imported inside a function
