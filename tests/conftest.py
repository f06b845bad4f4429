"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer


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
