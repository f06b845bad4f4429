"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer
from hypothesis import HealthCheck, settings

# Every Hypothesis property's settings: no per-example deadline (the default 200 ms failed a
# property on a machine at load 9-13 that passed alone) and no too_slow check, for the same
# reason; derandomized, so a failure reproduces, with no .hypothesis/ database to replay from.
settings.register_profile(
    "kubenpu",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("kubenpu")


@pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixture parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Real-kernel modules first: under `make test`'s two workers (--dist loadscope) the boots,
    minutes each, start at once and the unit modules fill in beside them. Stable: each module
    keeps its order."""
    items.sort(key=lambda item: item.get_closest_marker("vm") is None)


@pytest.fixture
def cri_socket(tmp_path: Path) -> str:
    return str(tmp_path / "cri.sock")


@pytest.fixture
def cri(cri_socket: str) -> Iterator[CriTestServer]:
    """A CRI test server listening on cri_socket, with no containers yet; stopped afterwards."""
    server = CriTestServer()
    server.start(cri_socket)
    yield server
    server.stop()
