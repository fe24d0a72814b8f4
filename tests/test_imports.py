"""No import circle between flowrl's packages: walk every module's imports (top level and inside functions)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "flowrl"


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def package_graph() -> dict[str, set[str]]:
    """flowrl.<package> -> the flowrl packages its modules import (a top-level module is its own package)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        source = _package(module)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: never imported at run time
                continue
            names: list[str] = []
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("flowrl.")
                and " " not in node.value
            ):
                names = [node.value]  # lazy-export tables name modules as strings: imported on first use
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("flowrl.") and (target := _package(name)) != source:
                    if (ROOT.parent / Path(*target.split("."))).exists() or (
                        ROOT.parent / (Path(*target.split(".")).as_posix() + ".py")
                    ).exists():
                        graph[source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_two_packages_import_each_other() -> None:
    assert cycles(package_graph()) == []


def test_model_loading_sits_below_train_and_export() -> None:
    graph = package_graph()
    assert "flowrl.train" not in graph["flowrl.export"] and "flowrl.models" in graph["flowrl.export"]
    assert "flowrl.train" not in graph["flowrl.models"] and "flowrl.export" not in graph["flowrl.models"]


def test_every_lazy_export_resolves() -> None:
    """A name in a package's lazy-export table is importable (a renamed function must not leave a dead entry)."""
    import importlib

    for init in ROOT.rglob("__init__.py"):
        module = ".".join(init.relative_to(ROOT.parent).with_suffix("").parts[:-1])
        package = importlib.import_module(module)
        for name, target in getattr(package, "_LAZY", {}).items():
            assert hasattr(importlib.import_module(target), name), f"{module}.{name} -> {target} does not exist"
