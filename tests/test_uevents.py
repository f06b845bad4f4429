"""Device hangs from kernel uevents (kubenpu.sources.wedges): the datagram format on the host's real
netlink socket, and the DRM wedged and devcoredump events a driver sends on a hang.

No driver here hangs on request, so the wedged and devcoredump datagrams are built as the
kernel builds them (lib/kobject_uevent.c: "ACTION@DEVPATH" then NUL-separated KEY=VALUE, the
keys drm_dev_wedged_event and devcoredump add) and fed through a socket stand-in; the host's
real netlink socket checks the format on a synthetic uevent the kernel sends itself.
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Clock, FakeResolver
from helpers import eventually, make_config, values

from kubenpu.discovery import discover, not_ignored
from kubenpu.metrics.catalogue import (
    DEVICE_COREDUMPS,
    DEVICE_RESETS,
    DEVICE_STATUS,
    UEVENTS_SKIPPED,
)
from kubenpu.metrics.series import Series
from kubenpu.sources.base import Node
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.jobs import Jobs
from kubenpu.sources.registry import table
from kubenpu.sources.telemetry import Telemetry
from kubenpu.sources.wedges import (
    LOG_BURST,
    LOG_EVERY_SECONDS,
    Uevent,
    Wedges,
    build,
    netlink_socket,
    parse,
)

TESTDATA = Path(__file__).parent / "testdata"
GPU = "0000:c3:00.0"  # amd-server's amdgpu card, /dev/dri/card1
GPU_PATH = "/devices/pci0000:c0/0000:c0:01.1/0000:c3:00.0"


def datagram(action: str, devpath: str, **env: str) -> bytes:
    fields = {"ACTION": action, "DEVPATH": devpath, **env, "SEQNUM": "4242"}
    return f"{action}@{devpath}\0".encode() + b"".join(
        f"{k}={v}\0".encode() for k, v in fields.items()
    )


def wedged(method: str, **env: str) -> bytes:
    """drm_dev_wedged_event()'s uevent on the card's primary node."""
    node = {"SUBSYSTEM": "drm", "DEVNAME": "dri/card1", "DEVTYPE": "drm_minor"}
    return datagram("change", f"{GPU_PATH}/drm/card1", **node, WEDGED=method, **env)


def card_added() -> bytes:
    return datagram("add", f"{GPU_PATH}/drm/card1", SUBSYSTEM="drm", DEVNAME="dri/card1")


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path


def wedges(root: Path, metrics: Series) -> Wedges:
    return Wedges(discover(root), metrics, root)


def handle(w: Wedges, *datagrams: bytes) -> None:
    for d in datagrams:
        event = parse(d)
        assert event is not None, d
        w.handle(event)


def status(metrics: Series) -> dict[str, float]:
    """The GPU's hw.status points that are 1."""
    return {key[-1]: v for key, v in values(metrics, DEVICE_STATUS).items() if key[0] == GPU}


def test_the_host_kernels_uevent_parses() -> None:
    """A synthetic uevent (writing "change" to a device's uevent file, as udevadm trigger
    does) comes from the kernel in the format of every other; /dev/null's is harmless."""
    trigger = Path("/sys/class/mem/null/uevent")
    with netlink_socket() as sock:
        try:
            trigger.write_text("change")
        except OSError as exc:
            pytest.skip(f"this host cannot trigger a uevent: {exc}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            event = parse(sock.recv(1 << 16))
            if event and event.devpath == "/devices/virtual/mem/null":
                break
        else:
            pytest.fail("the kernel sent no uevent for /dev/null")
    assert (event.action, event.env["SUBSYSTEM"], event.env["DEVNAME"]) == ("change", "mem", "null")


@pytest.mark.parametrize(
    "raw",
    [
        b"libudev\0\xfe\xed\xca\xfe",  # udevd's re-sent event (group 2)
        b"change@/devices/x\0ACTION=add\0",  # head and ACTION disagree
        b"change\0ACTION=change\0",  # no devpath
        b"change@devices/x\0ACTION=change\0",  # a devpath that is not absolute
        b"\0change@/devices/x\0ACTION=change\0",  # a leading NUL: no head
        b"",
    ],
)
def test_anything_but_a_kernel_uevent_is_none(raw: bytes) -> None:
    assert parse(raw) is None


def test_a_devpath_holding_an_at_sign_and_a_task_name_not_utf8_parse() -> None:
    """Device-tree devices are named after their nodes (an Adreno GPU under
    /devices/platform/soc@0); a task names itself with any bytes, shown replaced."""
    devpath = "/devices/platform/soc@0/3d00000.gpu/drm/card0"
    raw = datagram("change", devpath, SUBSYSTEM="drm").replace(b"SEQNUM", b"TASK=x\xff\0SEQNUM")
    event = parse(raw)
    assert event is not None
    assert (event.action, event.devpath, event.env["TASK"]) == ("change", devpath, "x\ufffd")


def test_a_head_that_is_no_text_parses_replaced() -> None:
    """Bytes past ASCII in the action or the devpath are no exception (one would end the
    thread): the event parses with them replaced, and no handler knows such an action."""
    event = parse(b"ch\xffange@/devices/\xff\0ACTION=ch\xffange\0")
    assert event is not None and (event.action, event.devpath) == (
        "ch\ufffdange",
        "/devices/\ufffd",
    )


def test_a_value_holding_an_equals_sign_is_kept_whole(machine: Path, caplog) -> None:
    """Only a field's first `=` ends its key: a task may name itself "a=b" (any process sets
    its own comm), and its wedged event still counts, the guilty task logged as it is."""
    raw = wedged("rebind", PID="4242", TASK="eval=1")
    event = parse(raw)
    assert event is not None and (event.env["TASK"], event.env["WEDGED"]) == ("eval=1", "rebind")
    metrics = table(60, 1000)
    with caplog.at_level("WARNING"):
        handle(wedges(machine, metrics), raw)
    assert values(metrics, DEVICE_RESETS) == {(GPU, "amdgpu", "rebind"): 1}
    assert "guilty pid 4242 (eval=1)" in caplog.text


def test_a_wedged_event_counts_a_reset_and_fails_the_device_until_it_is_added_again(
    machine: Path,
) -> None:
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    tel = Telemetry(discover(machine), metrics, machine, wedged=w.wedged)
    tel.sample({})
    assert status(metrics) == {"ok": 1}
    handle(w, wedged("rebind", PID="4242", TASK="trainer"))
    tel.sample({})
    assert status(metrics) == {"failed": 1}
    handle(w, card_added())  # the driver was bound again
    tel.sample({})
    assert status(metrics) == {"ok": 1}
    handle(w, wedged("none"))  # reset and recovered: counted, still ok
    tel.sample({})
    assert status(metrics) == {"ok": 1}
    resets = {(GPU, "amdgpu", "rebind"): 1, (GPU, "amdgpu", "none"): 1}
    assert values(metrics, DEVICE_RESETS) == resets


def test_a_wedged_card_with_uncorrected_errors_is_failed_not_degraded(machine: Path) -> None:
    """Uncorrected errors make the card degraded; a wedged event on top of them makes it failed
    (the worse state wins), and degraded again once a recovered event clears the wedge."""
    (machine / "sys" / GPU_PATH.lstrip("/") / "ras" / "umc_err_count").write_text("ue: 2\nce: 0\n")
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    tel = Telemetry(discover(machine), metrics, machine, wedged=w.wedged)
    tel.sample({})
    assert status(metrics) == {"degraded": 1}
    handle(w, wedged("rebind"))
    tel.sample({})
    assert status(metrics) == {"failed": 1}
    handle(w, wedged("none"))
    tel.sample({})
    assert status(metrics) == {"degraded": 1}


def test_a_later_recovered_event_clears_a_failed_device(machine: Path) -> None:
    w = wedges(machine, table(60, 1000))
    handle(w, card_added())  # the node of a device never wedged: nothing to clear
    assert not w.wedged(GPU)
    handle(w, wedged("bus-reset,vendor-specific"))
    assert w.wedged(GPU)
    handle(w, wedged("none"))
    assert not w.wedged(GPU)


def test_events_of_other_devices_and_without_wedged_are_not_resets(machine: Path) -> None:
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    other = datagram(
        "change", "/devices/x/drm/card7", SUBSYSTEM="drm", DEVNAME="dri/card7", WEDGED="rebind"
    )
    hotplug = datagram(
        "change", f"{GPU_PATH}/drm/card1", SUBSYSTEM="drm", DEVNAME="dri/card1", HOTPLUG="1"
    )
    handle(w, other, hotplug, datagram("change", "/devices/virtual/mem/null", SUBSYSTEM="mem"))
    assert values(metrics, DEVICE_RESETS) == {}
    assert values(metrics, UEVENTS_SKIPPED) == {("unknown_device",): 1}
    assert not w.wedged(GPU)


def dump_of(machine: Path, name: str, failing: Path) -> None:
    """devcoredump's devcdN device in the machine's sysfs, its failing_device link to failing."""
    dump = machine / "sys/devices/virtual/devcoredump" / name
    dump.mkdir(parents=True)
    (dump / "failing_device").symlink_to(os.path.relpath(failing, dump))  # as sysfs links it


def coredump(action: str, name: str) -> bytes:
    return datagram(action, f"/devices/virtual/devcoredump/{name}", SUBSYSTEM="devcoredump")


def test_a_devcoredump_is_counted_for_its_failing_device(machine: Path, caplog) -> None:
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    dump_of(machine, "devcd1", machine / f"sys{GPU_PATH}")
    dump_of(machine, "devcd2", machine / "sys/devices")
    handle(
        w,
        coredump("add", "devcd1"),
        coredump("add", "devcd2"),
        coredump("add", "devcd3"),  # gone before it was read
        coredump("remove", "devcd1"),
    )
    assert values(metrics, DEVICE_COREDUMPS) == {(GPU, "amdgpu"): 1}
    assert values(metrics, UEVENTS_SKIPPED) == {("unknown_device",): 2}
    assert caplog.messages == [
        f"device {GPU}: the driver captured a coredump (/devices/virtual/devcoredump/devcd1)"
    ]


def test_a_device_without_a_vendor_plugin_counts_with_an_empty_vendor(machine: Path) -> None:
    """The BMC's ast card (card0) has no vendor plug-in: its label is "", as on every series."""
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    dump_of(machine, "devcd1", machine / "sys/devices/pci0000:00/0000:00:1c.0/0000:02:00.0")
    node = {"SUBSYSTEM": "drm", "DEVNAME": "dri/card0"}
    handle(
        w, datagram("change", "/x/drm/card0", **node, WEDGED="rebind"), coredump("add", "devcd1")
    )
    assert values(metrics, DEVICE_RESETS) == {("0000:02:00.0", "", "rebind"): 1}
    assert values(metrics, DEVICE_COREDUMPS) == {("0000:02:00.0", ""): 1}


class Socket:
    """A socket whose recv returns the queued datagrams or raises the queued errors, then
    times out as the real one does each second."""

    def __init__(self, *queued: bytes | OSError) -> None:
        self.queued = list(queued)
        self.closed = False
        self.timeouts = 0

    def recv(self, size: int) -> bytes:
        size = operator.index(
            size
        )  # as strict as socket.recv: a size that is no int is a TypeError
        if not self.queued:
            time.sleep(0.01)
            self.timeouts += 1
            raise TimeoutError
        item = self.queued.pop(0)
        if isinstance(item, OSError):
            raise item
        return item[:size]

    def __enter__(self) -> Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True


@pytest.fixture
def running(machine: Path) -> Iterator[tuple[Wedges, Series, list[Socket]]]:
    """Wedges reading on its thread from sockets: the first open fails (a seccomp profile
    refusing netlink), the next one lost a burst (ENOBUFS) and then reads a wedged event."""
    metrics = table(60, 1000)
    opened: list[Socket] = []
    sockets: list[Socket | OSError] = [
        OSError(errno.EPROTONOSUPPORT, "Protocol not supported"),
        Socket(b"garbage", OSError(errno.ENOBUFS, "No buffer space available"), wedged("unknown")),
    ]

    def open_socket() -> Socket:
        item = sockets.pop(0)
        if isinstance(item, OSError):
            raise item
        opened.append(item)
        return item

    w = Wedges(discover(machine), metrics, machine, open_socket, retry_seconds=0.01)  # type: ignore[arg-type]
    w.start()
    yield w, metrics, opened
    w.close()


def test_the_thread_retries_a_socket_that_fails_and_counts_lost_and_bad_datagrams(
    running: tuple[Wedges, Series, list[Socket]],
) -> None:
    w, metrics, opened = running
    eventually(lambda: w.wedged(GPU), "the wedged event read")
    assert values(metrics, UEVENTS_SKIPPED) == {("malformed",): 1, ("overrun",): 1}
    assert values(metrics, DEVICE_RESETS) == {(GPU, "amdgpu", "unknown"): 1}
    eventually(lambda: opened[0].timeouts >= 2, "a quiet second after a quiet second")
    assert len(opened) == 1, "a quiet socket is read on, not opened again"
    w.close()
    assert opened[0].closed


def test_a_socket_that_cannot_be_opened_is_logged_with_why(machine: Path, caplog) -> None:
    def refused() -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    w = Wedges(discover(machine), table(60, 1000), machine, refused, retry_seconds=0.01)
    thread = w.start()
    assert thread.name == "uevents"  # Health watches it by its name
    line = "listening for kernel uevents failed (retrying): OSError: [Errno 93] Protocol not"
    eventually(lambda: line in caplog.text, "the failure logged")
    w.close()


def test_an_empty_wedged_method_is_unknown(machine: Path) -> None:
    metrics = table(60, 1000)
    w = wedges(machine, metrics)
    w.handle(Uevent("change", "/x", {"SUBSYSTEM": "drm", "DEVNAME": "dri/card1", "WEDGED": ""}))
    assert values(metrics, DEVICE_RESETS) == {(GPU, "amdgpu", "unknown"): 1}
    assert w.wedged(GPU)


def test_a_real_netlink_socket_is_a_kernel_uevent_listener() -> None:
    with netlink_socket() as sock, netlink_socket() as restarted:  # the kernel picks the port ids
        assert sock.family == socket.AF_NETLINK
        assert sock.getsockname()[1] == restarted.getsockname()[1] == 1  # the kernel's, not udevd's


class Reading:
    """A real netlink socket that says when its reader is in recv()."""

    def __init__(self) -> None:
        self.sock = netlink_socket()
        self.reading = threading.Event()

    def recv(self, size: int) -> bytes:
        self.reading.set()
        return self.sock.recv(size)

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_close_ends_the_thread_reading_a_quiet_real_socket(machine: Path) -> None:
    sock = Reading()
    w = Wedges(discover(machine), table(60, 1000), machine, lambda: sock)  # type: ignore[arg-type,return-value]
    thread = w.start()
    eventually(sock.reading.is_set, "in recv()")
    w.close()
    eventually(lambda: not thread.is_alive(), "the thread ended")


def test_each_wedged_event_hands_its_reset_to_the_jobs_stage(machine: Path) -> None:
    """kubenpu.sources.jobs counts the guilty pod (PID=) and the victims of each reset."""
    resets: list[tuple[str, int | None]] = []
    w = Wedges(discover(machine), table(60, 1000), machine, on_reset=lambda *r: resets.append(r))
    handle(
        w, wedged("rebind", PID="4242", TASK="trainer"), wedged("none"), wedged("none", PID="x1")
    )
    assert resets == [(GPU, 4242), (GPU, None), (GPU, None)]  # a PID that is no number: none


def test_a_pid_of_5000_digits_is_no_pid_and_the_reset_is_handled_whole(machine: Path) -> None:
    """int() refuses more than 4,300 digits with a ValueError, which left the event half
    handled (the reset counted, the jobs stage never told); PID_MAX_LIMIT has 7 digits."""
    metrics = table(60, 1000)
    resets: list[tuple[str, int | None]] = []
    w = Wedges(discover(machine), metrics, machine, on_reset=lambda *r: resets.append(r))
    handle(w, wedged("rebind", PID="9" * 5000), wedged("none", PID="4194304"))
    handle(w, wedged("none", PID="12345678"))  # one digit past any pid
    assert resets == [(GPU, None), (GPU, 4194304), (GPU, None)]
    assert values(metrics, UEVENTS_SKIPPED) == {("malformed",): 2}
    assert values(metrics, DEVICE_RESETS) == {
        (GPU, "amdgpu", "rebind"): 1,
        (GPU, "amdgpu", "none"): 2,
    }


def test_an_event_the_handler_fails_on_does_not_end_the_thread(machine: Path, caplog) -> None:
    """Whatever a handler raises is counted and logged; the next event is read."""
    metrics, resets = table(60, 1000), []

    def on_reset(device: str, guilty: int | None) -> None:
        resets.append(guilty)
        if guilty == 1:
            raise RuntimeError("a bug in a handler")

    sock = Socket(wedged("rebind", PID="1"), wedged("none", PID="2"))
    w = Wedges(discover(machine), metrics, machine, lambda: sock, on_reset=on_reset)  # type: ignore[arg-type]
    thread = w.start()
    eventually(lambda: resets == [1, 2], "both events handled")
    assert thread.is_alive()
    assert values(metrics, UEVENTS_SKIPPED) == {("malformed",): 1}
    assert "handling a kernel uevent failed (retrying): RuntimeError: a bug in a handler" in (
        caplog.text
    )
    w.close()


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("rebind", "rebind"),
        ("vendor-specific,bus-reset", "bus-reset,vendor-specific"),  # the kernel's order
        ("vendor-specific,bus-reset,rebind,none", "none,rebind,bus-reset,vendor-specific"),
        ("rebind,rebind", "rebind"),
        ("unknown", "unknown"),
        ("", "unknown"),
        ("rebind,x", "other"),  # one method past the kernel's
        ("r" * 10_000, "other"),
        ("rebind,", "other"),
    ],
)
def test_the_wedged_method_is_a_label_of_bounded_values(
    machine: Path, raw: str, label: str
) -> None:
    metrics = table(60, 1000)
    handle(wedges(machine, metrics), wedged(raw))
    assert values(metrics, DEVICE_RESETS) == {(GPU, "amdgpu", label): 1}


def test_a_task_name_is_logged_escaped(machine: Path, caplog) -> None:
    """Any process sets its own comm: a newline would forge a line, an escape drive a terminal."""
    forged = "x\nERROR root: forged\x1b[2J" + "y" * 500
    with caplog.at_level(logging.WARNING, "kubenpu.sources.wedges"):
        handle(wedges(machine, table(60, 1000)), wedged("rebind", PID="7", TASK=forged))
    [line] = caplog.messages
    assert "\n" not in line and "\x1b" not in line
    assert "guilty pid 7 (x\\nERROR root: forged\\x1b[2J" in line
    assert len(line) < 200  # cut short


def test_a_flood_of_resets_is_ten_lines_per_device_per_minute_then_their_sum(
    machine: Path, caplog
) -> None:
    clock = Clock()
    w = Wedges(discover(machine), table(60, 1000), machine, clock=clock)
    with caplog.at_level(logging.WARNING, "kubenpu.sources.wedges"):
        handle(w, *[wedged("rebind", PID=str(n)) for n in range(1, 20_001)])
        assert len(caplog.messages) == LOG_BURST
        clock.now += LOG_EVERY_SECONDS - 0.001
        w._lines.flush()
        assert len(caplog.messages) == LOG_BURST
        clock.now += 0.001
        w._lines.flush()
        assert len(caplog.messages) == LOG_BURST + 1
        handle(w, wedged("none"))  # the sum was the new window's first line: room for 9 more
    assert caplog.messages[LOG_BURST:] == [
        f"device {GPU} wedged 19990 more time(s) since its last line, the last: "
        "needs recovery by rebind, guilty pid 20000 (?)",
        f"device {GPU} wedged: reset and recovered",
    ]
    handle(w, *[wedged("none")] * (LOG_BURST - 1))  # 8 fill the window, the 9th is held
    assert len(caplog.messages) == 2 * LOG_BURST


def test_a_device_quiet_for_a_minute_has_ten_lines_again(machine: Path, caplog) -> None:
    clock = Clock()
    w = Wedges(discover(machine), table(60, 1000), machine, clock=clock)
    with caplog.at_level(logging.WARNING, "kubenpu.sources.wedges"):
        handle(w, *[wedged("none")] * LOG_BURST)  # the window full, nothing held
        clock.now += LOG_EVERY_SECONDS  # exactly its end
        handle(w, *[wedged("none")] * LOG_BURST)
    assert caplog.messages == [f"device {GPU} wedged: reset and recovered"] * 2 * LOG_BURST


def test_close_before_start_is_a_no_op(machine: Path) -> None:
    wedges(machine, table(60, 1000)).close()


def test_the_sum_of_held_reset_lines_is_written_when_the_thread_ends(
    running: tuple[Wedges, Series, list[Socket]], caplog
) -> None:
    w, _, _ = running
    eventually(lambda: w.wedged(GPU), "the wedged event read")
    with caplog.at_level(logging.WARNING, "kubenpu.sources.wedges"):
        for n in range(LOG_BURST + 2):
            w._lines.warn(GPU, f"event {n}")
        w.close()
    assert caplog.messages[-1] == (
        f"device {GPU} wedged 3 more time(s) since its last line, the last: event {LOG_BURST + 1}"
    )


def node_of(machine: Path, tmp_path: Path, telemetry: str, uevents: str) -> Node:
    """What the agent hands build(): the machine's devices and its root from the config."""
    text = f"telemetry:\n  enabled: {telemetry}\n  uevents: {uevents}\n"
    cfg = make_config(tmp_path, text)
    cfg.discovery.root = str(machine)
    found, resolver, metrics = discover(machine), FakeResolver(), table(60, 1000)
    attributor = Attributor(found, resolver, metrics)
    return Node(cfg, metrics, found, not_ignored(found, ()), resolver, attributor, activity=None)


@pytest.mark.parametrize(("telemetry", "uevents"), [("false", "true"), ("true", "false")])
def test_uevents_are_read_only_when_telemetry_and_uevents_are_on(
    machine: Path, tmp_path: Path, telemetry: str, uevents: str
) -> None:
    assert build(node_of(machine, tmp_path, telemetry, uevents)) is None


def test_the_built_source_reads_the_configured_root_and_hands_resets_to_the_jobs_source(
    machine: Path, tmp_path: Path
) -> None:
    node = node_of(machine, tmp_path, "true", "true")
    resets: list[tuple[str, int | None]] = []
    # No scheduler probe loads here: a Jobs without its kernel, its reset() recording the calls.
    jobs = Jobs(None, node.resolver, node.table, node.found)  # type: ignore[arg-type]
    jobs.reset = lambda *r: resets.append(r)  # type: ignore[method-assign]
    node.built["jobs"] = jobs
    w = build(node)
    assert w is not None
    dump_of(machine, "devcd1", machine / f"sys{GPU_PATH}")
    handle(w, wedged("rebind", PID="42"), coredump("add", "devcd1"))
    assert resets == [(GPU, 42)]
    assert values(node.table, DEVICE_RESETS) == {(GPU, "amdgpu", "rebind"): 1}
    assert values(node.table, DEVICE_COREDUMPS) == {(GPU, "amdgpu"): 1}  # under the root
    alone = build(node_of(machine, tmp_path, "true", "true"))  # no jobs source: no hand-off
    assert alone is not None
    handle(alone, wedged("none", PID="43"))
    assert resets == [(GPU, 42)] and alone.wedged(GPU) is False
