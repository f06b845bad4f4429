"""The agent's service group: one stop path, the last started first, under one deadline."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from helpers import eventually, free_port

from kubenpu import agent
from kubenpu.agent import wiring
from kubenpu.kernel.errors import ProbeError
from kubenpu.services import Services


def test_a_failure_stops_what_started_in_reverse_order():
    stopped: list[str] = []
    with pytest.raises(RuntimeError), Services(deadline_seconds=5) as services:
        services.add("exporters", lambda: stopped.append("exporters"))
        services.add("resolver", lambda: stopped.append("resolver"))
        raise RuntimeError("the probe cannot load")
    assert stopped == ["resolver", "exporters"]


def test_a_stop_that_fails_does_not_keep_the_others_running(caplog):
    stopped: list[str] = []

    def broken() -> None:
        raise OSError("socket gone")

    services = Services(deadline_seconds=5)
    services.add("exporters", lambda: stopped.append("exporters"))
    services.add("resolver", broken)
    services.shutdown()
    assert stopped == ["exporters"]
    assert "stopping failed" in caplog.text and "socket gone" in caplog.text


def test_one_deadline_bounds_the_whole_stop_path(caplog):
    caplog.set_level(logging.WARNING)
    hung, stopped = threading.Event(), []
    services = Services(deadline_seconds=0.2)
    services.add("exporters", lambda: stopped.append("exporters"))
    services.add("resolver", hung.wait)  # a CRI close that never returns
    # The resolver's stop never returns: the shutdown returns at all only by the deadline.
    # (Joined within a minute, not 2 s: a loaded machine must not fail it.)
    stopping = threading.Thread(target=services.shutdown, daemon=True)
    stopping.start()
    stopping.join(60)
    assert not stopping.is_alive(), "the shutdown waited on a stop that never returns"
    # Still started once the deadline has passed, with no time left to wait for it.
    eventually(lambda: stopped == ["exporters"], "the exporters stopped")
    assert "resolver did not stop within the 0.2 s stop deadline" in caplog.text
    hung.set()


def test_a_kernel_that_cannot_load_stops_the_exporters_already_started(tmp_path, monkeypatch):
    """build() starts the exporters before the kernel side, which can raise: main exits 2 and
    the metrics port is closed, not left serving."""
    port = free_port()
    config = tmp_path / "kubenpu.yaml"
    config.write_text(
        f"fdinfo: {{enabled: false}}\nexport: {{prometheus: {{host: 127.0.0.1, port: {port}}}}}\n"
    )
    serving: list[bool] = []

    def no_kernel(*args: object, **kwargs: object) -> None:
        with socket.socket() as s:
            serving.append(s.connect_ex(("127.0.0.1", port)) == 0)
        raise ProbeError("cannot attach to security_file_ioctl: no BTF")

    monkeypatch.setattr(wiring, "open_kernel", no_kernel)
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)  # the root logger stays as is
    assert agent.main(["--config", str(config)]) == 2
    with socket.socket() as s:
        assert serving == [True] and s.connect_ex(("127.0.0.1", port)) != 0
