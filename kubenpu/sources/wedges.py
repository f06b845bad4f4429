"""Device hangs and resets from the kernel's uevents: DRM wedged events and device coredumps.

- ``drm_dev_wedged_event()`` (drivers/gpu/drm/drm_drv.c, commit b7cf9f4ac1b8, 6.15) sends a
  ``change`` uevent on the device's primary node with ``WEDGED=<method>[,<method>]``: ``none``
  after a reset that recovered it, else what recovery it needs (``rebind``, ``bus-reset``,
  ``vendor-specific``; ``unknown`` when the driver cannot say), and ``PID=``/``TASK=`` where the
  driver knows the guilty task (struct drm_wedge_task_info, 6.17). The agent counts each
  (``kubenpu_device_resets_total{method}``) and logs a line; a device whose last event asks for
  a recovery is ``failed`` (hw.status) until its node is added again (a rebind) or a later
  event says ``none``.
- devcoredump (drivers/base/devcoredump.c) adds a ``devcdN`` device whose ``failing_device``
  link names the device the driver dumped: ``kubenpu_device_coredumps_total``.

The kernel multicasts uevents on NETLINK_KOBJECT_UEVENT group 1 to every network namespace
owned by the initial user namespace (lib/kobject_uevent.c), a pod's too, and the protocol lets
any process listen (NL_CFG_F_NONROOT_RECV): no capability, no host network. Reading happens on
the agent's own ``uevents`` thread; counting never waits on it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.metrics.catalogue import DEVICE_COREDUMPS, DEVICE_RESETS, UEVENT_SKIPS, UEVENTS_SKIPPED
from kubenpu.metrics.series import Series, by_label, by_labels
from kubenpu.services import Streak, Worker
from kubenpu.sources.base import Node
from kubenpu.sources.jobs import Jobs
from kubenpu.text import ascii_digits, printable

log = logging.getLogger(__name__)

NETLINK_KOBJECT_UEVENT = 15  # include/uapi/linux/netlink.h
KERNEL_GROUP = 1  # the kernel's own events; udevd re-sends them on group 2 (libudev format)
_MAX_DATAGRAM = 64 << 10  # UEVENT_BUFFER_SIZE is 2 KiB; a datagram is never larger than this
_RCVBUF = 1 << 20  # room for a burst of hotplug events before the kernel drops (ENOBUFS)
_SUBSYSTEMS = ("drm", "accel")
RECOVERED = "none"  # WEDGED=none: reset and usable again
# drm_get_wedge_recovery()'s names in the order of their bits, and "unknown" when the driver
# cannot say: any other method (a newer kernel's, a forged event's) is "other", so the label
# has a bounded set of values.
METHODS = (RECOVERED, "rebind", "bus-reset", "vendor-specific")
PID_MAX_DIGITS = 7  # PID_MAX_LIMIT is 4,194,304 (include/linux/threads.h)
LOG_EVERY_SECONDS = 60.0  # at most LOG_BURST reset lines per device this often, then a sum
LOG_BURST = 10
_LOGGED_VALUE = 64  # characters of a uevent value a log line shows

# set(RESETS, (device, vendor, method), 1): one DRM wedged uevent of the device.
RESETS = by_labels(DEVICE_RESETS)
COREDUMPS = by_labels(DEVICE_COREDUMPS)  # set(COREDUMPS, (device, vendor), 1)
SKIPS = by_label(UEVENTS_SKIPPED, UEVENT_SKIPS)
FAMILIES = (RESETS, COREDUMPS, SKIPS)


@dataclass(frozen=True)
class Uevent:
    action: str
    devpath: str
    env: Mapping[str, str]


def parse(datagram: bytes) -> Uevent | None:
    """A kernel uevent: ``ACTION@DEVPATH`` then ``KEY=VALUE`` fields, NUL-separated; None for
    anything else (udevd's ``libudev`` messages, a truncated read)."""
    head, *fields = datagram.rstrip(b"\0").split(b"\0")
    action, at, devpath = head.partition(b"@")
    if not at or not devpath.startswith(b"/"):
        return None
    try:
        env = dict(f.decode("utf-8", "replace").split("=", 1) for f in fields if b"=" in f)
    except ValueError:
        return None
    if env.get("ACTION") != action.decode("ascii", "replace"):
        return None
    return Uevent(env["ACTION"], devpath.decode("utf-8", "replace"), env)


def method(wedged: str) -> str:
    """WEDGED='s value as a label of bounded values: the kernel's methods in its order (one
    event may ask for several), "unknown" for none, "other" for anything else."""
    if not wedged or wedged == "unknown":
        return "unknown"
    asked = set(wedged.split(","))
    if not asked <= set(METHODS):
        return "other"
    return ",".join(m for m in METHODS if m in asked)


def pid(value: str) -> int | None:
    """PID= as a pid; None for anything that is none (the digits are bounded before int(),
    which refuses more than 4,300 of them with a ValueError)."""
    if not ascii_digits(value) or len(value) > PID_MAX_DIGITS:
        return None
    return int(value)


def shown(value: str) -> str:
    """A uevent value as a log line shows it: any process names its own TASK= (comm), so
    escaped (no forged line, no terminal escape) and cut short."""
    return printable(value[:_LOGGED_VALUE])


class Lines:
    """The reset lines of the log: at most `burst` per device per `every` seconds, the events
    past them summed into one line once the window is over (a flood of resets must not flood
    the log; the counter counts each)."""

    def __init__(self, every: float, burst: int, clock: Callable[[], float]) -> None:
        self._every = every
        self._burst = burst
        self._clock = clock
        self._window: dict[str, tuple[float, int]] = {}  # device -> (its start, lines in it)
        self._held: dict[str, tuple[int, str]] = {}  # device -> (events not written, the last)

    def warn(self, device: str, text: str) -> None:
        self.flush()
        now = self._clock()
        start, written = self._window.get(device, (now, 0))
        if now - start >= self._every:
            start, written = now, 0
        if written < self._burst:
            self._window[device] = (start, written + 1)
            log.warning("device %s wedged: %s", device, text)
            return
        self._window[device] = (start, written)
        held, _ = self._held.get(device, (0, ""))
        self._held[device] = (held + 1, text)

    def flush(self, final: bool = False) -> None:
        """Write the sum of each device's held events once its window is over (at each event,
        and each second the socket is quiet), or now if `final` (the thread ends)."""
        now = self._clock()
        for device, (held, text) in list(self._held.items()):
            if final or now - self._window[device][0] >= self._every:
                del self._held[device]
                self._window[device] = (now, 1)  # the sum is the new window's first line
                log.warning(
                    "device %s wedged %d more time(s) since its last line, the last: %s",
                    device,
                    held,
                    text,
                )


def netlink_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)  # capped at rmem_max
    sock.bind((0, KERNEL_GROUP))
    sock.settimeout(1.0)  # close() is seen within a second
    return sock


class Wedges:
    """Counts the devices' wedged and coredump uevents, and knows which devices wait for a
    recovery. ``handle()`` is one event; ``start()`` reads them on a thread until ``close()``.
    A socket that cannot be opened (a kernel without netlink, a seccomp profile refusing it)
    is logged once and retried at each ``interval``: the rest of the agent runs on."""

    name = "uevents"

    def __init__(
        self,
        devices: Iterable[Device],
        metrics: Series,
        root: str | Path = "/",
        open_socket: Callable[[], socket.socket] = netlink_socket,
        retry_seconds: float = 30.0,
        on_reset: Callable[[str, int | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._devices = list(devices)
        self._metrics = metrics
        self._root = Path(root)
        self._open = open_socket
        self._retry = retry_seconds
        self._on_reset = on_reset  # (device id, guilty pid): kubenpu.sources.jobs.Jobs.reset
        self._by_devname = {n.path.removeprefix("/dev/"): d for d in self._devices for n in d.nodes}
        self._failed: dict[str, str] = {}  # device id -> the recovery it waits for
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Worker | None = None
        self._failures = Streak("listening for kernel uevents", log)
        self._handling = Streak("handling a kernel uevent", log)
        self._lines = Lines(LOG_EVERY_SECONDS, LOG_BURST, clock)

    def wedged(self, device: str) -> bool:
        """The device's last wedged event asks for a recovery that has not happened."""
        with self._lock:
            return device in self._failed

    def start(self) -> Worker:
        self._thread = Worker(self.name, self._run)
        self._thread.start()
        return self._thread

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._open() as sock:
                    self._failures.ok()
                    self._read(sock)
            except OSError as exc:
                self._failures.failed(exc)
                self._stop.wait(self._retry)
        self._lines.flush(final=True)

    def _read(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                datagram = sock.recv(_MAX_DATAGRAM)
            except TimeoutError:
                self._lines.flush()
                continue
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                # The socket's buffer overflowed (a burst of hotplug events): some were lost.
                self._metrics.set(SKIPS, "overrun", 1)
                continue
            event = parse(datagram)
            if event is None:
                self._metrics.set(SKIPS, "malformed", 1)
                continue
            try:
                self.handle(event)
            except Exception as exc:  # one event the code did not expect must not end the thread
                self._metrics.set(SKIPS, "malformed", 1)
                self._handling.failed(exc)
            else:
                self._handling.ok()

    def handle(self, event: Uevent) -> None:
        subsystem = event.env.get("SUBSYSTEM")
        if subsystem in _SUBSYSTEMS:
            self._drm(event)
        elif subsystem == "devcoredump" and event.action == "add":
            self._coredump(event)

    def _drm(self, event: Uevent) -> None:
        device = self._by_devname.get(event.env.get("DEVNAME", ""))
        if "WEDGED" not in event.env and event.action != "add":
            return  # hotplug and connector events: not the device's health
        if device is None:
            self._metrics.set(SKIPS, "unknown_device", 1)
            return
        if event.action == "add":  # the node is back: a rebind or a bus reset recovered it
            with self._lock:
                self._failed.pop(device.id, None)
            return
        self._wedged(device, event.env)

    def _wedged(self, device: Device, env: Mapping[str, str]) -> None:
        how = method(env["WEDGED"])
        with self._lock:
            if how == RECOVERED:
                self._failed.pop(device.id, None)
            else:
                self._failed[device.id] = how
        self._metrics.set(RESETS, (device.id, device.vendor or "", how), 1)
        guilty = pid(env.get("PID", ""))
        if "PID" in env and guilty is None:  # the reset counts; its guilty task is unknown
            self._metrics.set(SKIPS, "malformed", 1)
        if self._on_reset is not None:
            self._on_reset(device.id, guilty)
        task = shown(env.get("TASK", "?"))
        named = f", guilty pid {guilty} ({task})" if guilty is not None else ""
        asked = "reset and recovered" if how == RECOVERED else f"needs recovery by {how}"
        self._lines.warn(device.id, f"{asked}{named}")

    def _coredump(self, event: Uevent) -> None:
        link = self._root / "sys" / event.devpath.lstrip("/") / "failing_device"
        try:
            failing = os.path.realpath(link, strict=True)
        except OSError:
            failing = ""
        device = next((d for d in self._devices if self._sysfs(d) == failing), None)
        if device is None:
            self._metrics.set(SKIPS, "unknown_device", 1)
            return
        self._metrics.set(COREDUMPS, (device.id, device.vendor or ""), 1)
        log.warning(
            "device %s: the driver captured a coredump (%s)", device.id, printable(event.devpath)
        )

    def _sysfs(self, device: Device) -> str:
        return os.path.realpath(device.nodes[0].sysfs(self._root) / "device")


def build(node: Node) -> Wedges | None:
    """The uevents source, if `telemetry.enabled` and `telemetry.uevents`; a reset goes to the
    GPU jobs source, when built, for its victims."""
    cfg = node.cfg.telemetry
    if not (cfg.enabled and cfg.uevents):
        return None
    jobs = node.built.get("jobs")
    on_reset = jobs.reset if isinstance(jobs, Jobs) else None
    return Wedges(node.watched, node.table, node.cfg.discovery.root, on_reset=on_reset)
