"""kubenpu's modules import each other in one direction: down the layers of LAYERS, never up, and
without a cycle (imports under TYPE_CHECKING aside)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The layers, lowest first: a module may import its own layer's and those below, never one above.
# The order is the data flow (docs/architecture.md): the node's devices, the kernel side, the
# resolver, the series table, the sources that write it, export, then the agent and the CLI. An
# entry names a module and the modules below it (a package); the longest entry that names a
# module is its layer. "kubenpu" names kubenpu/__init__.py alone.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "kubenpu",
        "kubenpu.descriptors",
        "kubenpu.files",
        "kubenpu.services",
        "kubenpu.text",
        "kubenpu.vendors",
        "kubenpu.metrics.catalogue",  # names only (specs, reasons): every layer may name them
    ),
    # The node's devices, and the pure readers kubenpuctl shares with the sources.
    ("kubenpu.discovery", "kubenpu.sources.fdinfo", "kubenpu.sources.sysfs"),
    ("kubenpu.kernel",),
    ("kubenpu.resolve",),
    ("kubenpu.config",),
    ("kubenpu.metrics",),  # the series table: it imports no source
    ("kubenpu.sources",),  # every signal, its framework (base) and its registry
    ("kubenpu.export",),
    ("kubenpu.agent",),  # wiring, loop, health, the program
    ("kubenpu.cli",),
)


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


def _layer(module: str) -> int | None:
    """The index in LAYERS of the longest entry naming `module`; None if none does."""
    found = [
        (len(entry), i)
        for i, entries in enumerate(LAYERS)
        for entry in entries
        if module == entry or (entry != "kubenpu" and module.startswith(entry + "."))
    ]
    return max(found)[1] if found else None


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above the importer's, as `importer -> imported`."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (_layer(target) or 0) > (_layer(module) or 0)
    ]


def test_the_graph_is_read():
    graph = _graph()
    assert "kubenpu.metrics.series" in graph["kubenpu.sources.usage"]  # else the next passes idly
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_no_module_imports_itself_through_others():
    assert _cycle(_graph()) is None


def test_every_module_has_a_layer():
    assert [m for m in sorted(_graph()) if _layer(m) is None] == []


def test_no_module_imports_one_from_a_layer_above():
    assert (
        _layer("kubenpu.kernel.maps")
        < _layer("kubenpu.sources.calls.events")
        < _layer("kubenpu.agent.wiring")
    )
    assert _upward({"kubenpu.kernel.maps": {"kubenpu.sources.calls.events"}}) == [
        "kubenpu.kernel.maps -> kubenpu.sources.calls.events"
    ]
    assert _upward(_graph()) == []
