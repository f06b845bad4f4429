"""Host-side helpers shared by several test files (see each section's comment)."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubenpu import config, export
from kubenpu.metrics import Metrics

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
