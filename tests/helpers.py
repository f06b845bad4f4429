"""Host-side helpers shared by several test files (see each section's comment)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

# --- Helm: the chart rendered by real helm (fetched by scripts/k8s-tools.sh); used by the deploy
# tests and by the VM tests that run the agent with the chart's settings.

CHART = ROOT / "deploy" / "helm" / "kubenpu"
RELEASE = NAMESPACE = "kubenpu"


@functools.cache
def k8s_tools() -> Path:
    """The directory holding helm and kubectl (downloaded once, then cached)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "k8s-tools.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def helm_values(**overrides: Any) -> dict[str, Any]:
    """The chart's values.yaml with overrides; `a__b=v` sets values["a"]["b"] = v."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = values
        for key in parents:
            node = node[key]
        node[leaf] = value
    return values


def helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with `values` (merged over the chart's defaults by helm itself) on stdin."""
    return subprocess.run(
        [str(k8s_tools() / "helm"), *args, "--values", "-"],
        input=yaml.safe_dump(values or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def render_helm(
    values: dict[str, Any] | None = None, chart: Path = CHART, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its objects, parsed."""
    proc = helm("template", RELEASE, str(chart), "--namespace", namespace, values=values)
    assert proc.returncode == 0, f"helm template: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]
