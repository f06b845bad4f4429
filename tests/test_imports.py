"""kubenpu's modules import each other without a cycle (imports under TYPE_CHECKING aside)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    return {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }


def _graph() -> dict[str, set[str]]:
    paths = [p for p in (ROOT / "kubenpu").rglob("*.py") if "_pb2" not in p.name]
    modules = {_module(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from pkg import mod` depends on the module, `from mod import name` on mod
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules
                targets |= subs or {node.module}
        graph[_module(path)] = (targets & modules) - {_module(path)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            if found := visit(target, [*path, module]):
                return found
        done.add(module)
        return None

    return next((c for m in sorted(graph) if (c := visit(m, []))), None)


def test_the_graph_is_read():
    graph = _graph()
    assert "kubenpu.metrics.store" in graph["kubenpu.usage"]  # else the next passes idly
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_no_module_imports_itself_through_others():
    assert _cycle(_graph()) is None
