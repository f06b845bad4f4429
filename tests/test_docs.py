"""The docs name only what exists: every file, module, class, function and config key that
docs/architecture.md quotes is checked against the tree (HELP texts vs docs/metrics.md are checked
in test_metrics.py)."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
QUOTED = re.findall(r"`([^`]+)`", ARCHITECTURE)


def _defined_names() -> set[str]:
    """Every class, function, method, enum member and module-level name defined in kubenpu/."""
    names: set[str] = set()
    for path in (ROOT / "kubenpu").rglob("*.py"):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
                names.update(t.attr for t in targets if isinstance(t, ast.Attribute))
    return names


def _config_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _config_keys(value, f"{prefix}{key}.")
    return keys


CODE_NAME = re.compile(r"^([A-Za-z_]\w*)(\.[A-Za-z_]\w*)?\(|^[A-Z][a-z]\w*$|^[A-Z]\w*\.[a-z_]\w*$")
PATH = re.compile(r"^[\w.-]+/[\w./-]*$")
CONFIG_KEY = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def test_the_architecture_doc_quotes_code():
    # If these patterns stopped matching, the test below would check nothing.
    assert sum(bool(CODE_NAME.match(q)) for q in QUOTED) >= 20
    assert sum(bool(PATH.match(q)) for q in QUOTED) >= 8


@pytest.mark.parametrize("path", sorted({q for q in QUOTED if PATH.match(q)}))
def test_every_quoted_path_exists(path):
    assert (ROOT / path).exists(), f"docs/architecture.md names {path}, which does not exist"


@pytest.mark.parametrize("quoted", sorted({q for q in QUOTED if CODE_NAME.match(q)}))
def test_every_quoted_class_and_function_exists(quoted):
    names = _defined_names() | set(dir(builtins))
    for part in re.findall(r"([A-Za-z_]\w*)(?=\(|\.|$)", quoted.split("(")[0]):
        assert part in names, f"docs/architecture.md names {part} ({quoted!r}); kubenpu/ has none"


def test_every_quoted_config_key_exists():
    keys = _config_keys(yaml.safe_load((ROOT / "config" / "kubenpu.yaml").read_text()))
    quoted = {q for q in QUOTED if CONFIG_KEY.match(q) and not q.endswith((".py", ".c", ".md"))}
    short = {k.split(".", 1)[1] for k in keys if "." in k}
    missing = {q for q in quoted if q not in keys and q not in short}
    assert not missing, f"docs/architecture.md names config keys that do not exist: {missing}"


@pytest.mark.parametrize("spec", ["Kind", "Vendor", "Device", "Tally", "Resolver", "Metrics"])
def test_named_public_surfaces_are_quoted(spec):
    # The table lists each stage's public surface; these must stay in it.
    assert f"`{spec}" in ARCHITECTURE


def test_the_drops_contract_lists_every_drop_reason():
    from kubenpu.events import Drop

    contract = ARCHITECTURE.split("- **Drops.**", 1)[1].split("\n- ", 1)[0]
    quoted = set(re.findall(r"`([a-z_]+)` \(", contract))  # each reason is followed by its why
    assert {r.value for r in Drop} == quoted
