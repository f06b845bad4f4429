"""Shared host-side test helpers: test files import these, never each other's private functions."""

from __future__ import annotations

import functools
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

# --- VM test records: the result.json files tests/vm/*_guest.py write -----------------------------
# /metrics samples in a record are read with the guests' own projections (tests/vm/guestlib.py).
from vm.guestlib import LABELS, by_reason, ioctl_counts

from kubenpu import config, export
from kubenpu.metrics import Metrics
from kubenpu.resolve import Attribution, Resolver

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["by_reason", "expected_counts", "ioctl_counts", "otlp_counts"]


def expected_counts(rows: list[dict]) -> dict[tuple, float]:
    """A record's expected kubenpu_ioctl_total series ([{labels, value}]) by their LABELS values."""
    return {tuple(r["labels"]): r["value"] for r in rows}


def otlp_counts(points: list[dict]) -> dict[tuple, float]:
    """The kubenpu.ioctl points an OTLP receiver got ([{attributes, value}]) by LABELS values."""
    return {tuple(p["attributes"][k] for k in LABELS): p["value"] for p in points}


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


# --- resolve: wait for what a Resolver answers once its CRI lookup (off the caller's thread) ends

T = TypeVar("T")


def eventually(check: Callable[[], T | None], what: str, bound: float = 30.0) -> T:
    """check()'s first answer that is not None or False; a generous bound, not a timing claim."""
    deadline = time.monotonic() + bound
    while (value := check()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound:g}s")
        time.sleep(0.005)
    return value


def resolved(resolver: Resolver, cgroup_id: int) -> Attribution:
    """Polls resolve() until the pending lookup has answered."""
    return eventually(lambda: resolver.resolve(cgroup_id), f"cgroup {cgroup_id} resolved")


# --- export: a config from YAML text, a free port, a stub Health, Telemetry as the agent starts it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> config.Config:
    p = tmp_path / "kubenpu.yaml"
    p.write_text(text)
    return config.load(str(p), {"K8S_NODE_NAME": "node-a", **(env or {})})


@dataclass
class StubHealth:
    """export.Health with answers the test sets (the agent's real one is tested with the agent)."""

    is_live: tuple[bool, str] = (True, "")
    is_ready: tuple[bool, str] = (True, "")

    def live(self) -> tuple[bool, str]:
        return self.is_live

    def ready(self) -> tuple[bool, str]:
        return self.is_ready


def start_telemetry(
    cfg: config.Config,
    clock: Callable[[], float] = time.monotonic,
    health: export.Health | None = None,
) -> export.Telemetry:
    """export.start as the agent calls it: the caller creates Metrics."""
    m = cfg.metrics
    metrics = Metrics(cfg.node_name, m.series_ttl_seconds, m.max_series, clock)
    return export.start(cfg, metrics, health or StubHealth())


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()
