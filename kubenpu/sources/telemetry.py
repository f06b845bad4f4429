"""The agent's device telemetry sampler: kubenpu.sources.sysfs's reads on the fdinfo interval,
into the series table.

``Telemetry`` reads every device on the fdinfo interval on its own ``telemetry`` thread, each
device's files on a daemon thread of their own within ``telemetry.deadline_seconds``: a driver
can block a sysfs read for good (during a GPU reset), and that must hold up neither counting nor
the other devices. It keeps the device's energy counter across wraps and resets (each step held
against the device's highest power limit: kubenpu.sources.energy.step), integrates power where a
driver has no energy counter, and splits each increment among pods (kubenpu.sources.energy) by
the busy time the attribution thread hands it after each fdinfo read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.metrics.catalogue import (
    DEVICE_STATUS,
    ENERGY,
    ENERGY_IDLE,
    ENERGY_UNATTRIBUTED,
    POD_ENERGY,
    POWER,
    TELEMETRY_SKIPPED,
    TELEMETRY_SPECS,
    TELEMETRY_STALE,
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    VOLTAGE,
    Attrs,
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.points import Point, Snapshot
from kubenpu.metrics.series import NodeFamily, PodFamily, Series, added, by_label
from kubenpu.services import Streak, Worker
from kubenpu.sources import energy
from kubenpu.sources.base import Node, Report
from kubenpu.sources.fdinfo import Skip
from kubenpu.sources.sysfs import Points, Reading, health, read_device
from kubenpu.sources.usage import SKIPS as USAGE_SKIPS
from kubenpu.sources.usage import Usage
from kubenpu.sources.wedges import Wedges

log = logging.getLogger(__name__)

DEADLINE = "deadline"  # a device's read still running at the deadline
# The telemetry of a sensor, a component of its own in semconv: its hw.type.
_SENSOR_TYPES = {TEMPERATURE: "temperature", TEMPERATURE_LIMIT: "temperature", VOLTAGE: "voltage"}
# PCI vendor ids to hw.vendor.
_HW_VENDOR = {
    "8086": "Intel",
    "1002": "AMD",
    "1da3": "Habana",
    "10de": "NVIDIA",
    "17cb": "Qualcomm",
    "1af4": "Red Hat",
}
# hw.vendor of platform (non-PCI) devices, by driver: the IP's designer, as the drivers'
# Kconfig names it (drivers/gpu/drm/<driver>/Kconfig, drivers/accel/rocket/Kconfig).
_PLATFORM_VENDORS = {
    "panfrost": "Arm",
    "panthor": "Arm",
    "lima": "Arm",
    "etnaviv": "Vivante",
    "v3d": "Broadcom",
    "vc4": "Broadcom",
    "msm": "Qualcomm",
    "rocket": "Rockchip",
}
# hw.status: each state is a point, 1 for the device's state now.
STATES = ("ok", "degraded", "failed")

# Busy per recipient in one interval: [busy ns, busy cycles, elapsed cycles].
Busy = Mapping[str, Mapping[Where | None, list[int]]]
_DeviceBusy = dict[Where | None, list[int]]
Clock = Callable[[], int]


def _add(into: _DeviceBusy, busy: Mapping[Where | None, list[int]]) -> None:
    """Adds one interval's busy time to what is kept since the device's last read. Successive
    intervals, so elapsed cycles add too (usage._add_busy merges the clients of one interval,
    where the elapsed cycles are one clock's and the largest stands)."""
    for where, counts in busy.items():
        kept = into.setdefault(where, [0] * len(counts))
        kept[:] = [a + b for a, b in zip(kept, counts, strict=True)]


class _Read:
    """One device's read, on its own daemon thread: a sysfs read that blocks (a driver in a GPU
    reset) holds that thread alone. Python cannot kill it, so the device gets no second read
    until it returns."""

    def __init__(
        self, read: Callable[[Device, Path], Reading], device: Device, root: Path, clock: Clock
    ) -> None:
        self.done = threading.Event()
        self.reading: Reading | None = None
        self.error: Exception | None = None  # what the read raised, for the device's Streak
        self.at_ns = 0
        self._args = (read, device, root, clock)
        threading.Thread(target=self._run, name=f"telemetry {device.id}", daemon=True).start()

    def _run(self) -> None:
        read, device, root, clock = self._args
        try:
            self.reading = read(device, root)
        except Exception as exc:  # read_device does not raise on sysfs; anything else is a bug
            self.error = exc
        finally:
            self.at_ns = clock()
            self.done.set()


# A device's state: kept when the cap leaves no room for its other telemetry, so a full cap never
# hides that a device failed or went stale (docs/metrics.md, The series cap).
_STATE_SPECS = (DEVICE_STATUS, TELEMETRY_STALE)


def _fit(points: Points, room: int) -> tuple[Points, int, int]:
    """The device's points within `room`: its state first, then the rest in read order."""
    ranked = sorted(points, key=lambda p: p[0] not in _STATE_SPECS)  # stable
    state = sum(p[0] in _STATE_SPECS for p in points)
    kept = ranked[: max(room, state)]
    return kept, len(kept), len(points) - len(kept)


def _telemetry_points(rows: dict[str, Points], start: int) -> Snapshot:
    return [
        (spec, [Point(a, v, start) for points in rows.values() for s, a, v in points if s is spec])
        for spec in TELEMETRY_SPECS
    ]


# set(TELEMETRY, device, points): the device's telemetry of its last read (counters cumulative).
TELEMETRY = NodeFamily("telemetry", _telemetry_points, fit=_fit)
SKIPS = by_label(TELEMETRY_SKIPPED)
# put(POD_ENERGY_SHARES, where, "", µJ): a pod's share of its device's energy, in whole µJ (sums
# stay exact); its series retire with the pod's calls.
POD_ENERGY_SHARES = PodFamily(
    POD_ENERGY.name,
    lambda rows: [(POD_ENERGY, [Point(r.where, r.value / 1e6, r.start_ns) for r in rows])],
    added,
)
FAMILIES = (TELEMETRY, SKIPS, POD_ENERGY_SHARES)


class Telemetry:
    """Reads every device's telemetry on its own thread and turns energy increments into
    per-pod energy. The attribution thread only hands it busy time (`submit`): counting never
    waits on sysfs. `sample()` is one read; `start()` runs it at each `submit` until `close()`,
    each read through the source's Report (its stamp, duration and failures)."""

    name = "telemetry"

    def __init__(
        self,
        devices: Iterable[Device],
        metrics: Series,
        root: str | Path = "/",
        clock: Clock = time.monotonic_ns,
        deadline: float = 1.0,
        read: Callable[[Device, Path], Reading] = read_device,
        wall: Callable[[], float] = time.time,
        wedged: Callable[[str], bool] = lambda device: False,
        busy: Callable[[], Busy] = dict,
        stale_after: float | None = None,
    ) -> None:
        self._devices = list(devices)
        self._metrics = metrics
        self._root = Path(root)
        self._clock = clock
        self._deadline = deadline
        self._read_device = read
        self._report = Report(self.name, metrics, wall=wall)
        self._busy_of = busy  # the last fdinfo interval's busy time (Usage.interval_busy)
        self._stale_after = stale_after  # its thread's: kubenpu.services.Worker
        self._wedged = wedged  # a device's last DRM wedged uevent asks for a recovery (Wedges)
        self._hw = {d.id: _hw_attrs(d) for d in self._devices}
        self._meters: dict[str, energy.Meter[Where]] = {d.id: energy.Meter() for d in self._devices}
        self._reads: dict[str, _Read] = {}  # the devices' reads not applied yet
        self._busy: dict[str, _DeviceBusy] = {d.id: {} for d in self._devices}  # since each read
        self._last: dict[str, Points] = {}  # each device's points of its last finished read
        self._lock = threading.Lock()
        self._submitted: dict[str, _DeviceBusy] = {}  # busy time the thread has not taken yet
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Worker | None = None
        self._streaks = {d.id: Streak(f"reading the telemetry of {d.id}", log) for d in devices}

    def tick(self) -> None:
        """After the interval's reads (fdinfo's first): its busy time to the thread."""
        self.submit(self._busy_of())

    def submit(self, busy: Busy) -> None:
        """Hands one fdinfo interval's busy time (Usage.interval_busy()) to the telemetry
        thread, which reads at once. Never waits: busy time handed while a read is still
        running is added up and split at the read after it."""
        with self._lock:
            for device, per in busy.items():
                _add(self._submitted.setdefault(device, {}), per)
        self._wake.set()

    def start(self) -> Worker:
        """The sampler's thread, started: it fails liveness when a step is older than
        `stale_after` (the agent ticks once every fdinfo interval)."""
        self._thread = Worker(self.name, self._loop, stale_after=self._stale_after)
        self._thread.start()
        return self._thread

    def close(self) -> None:
        """Stops the thread after its read; a device read stuck in sysfs is left behind (its
        thread is a daemon)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self._deadline + 1)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._thread is not None:
                self._thread.beat()
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                busy, self._submitted = self._submitted, {}
            self._report.read(partial(self.sample, busy))  # no bad read stops the next ones

    def sample(self, busy: Busy) -> None:
        """One read of every device, each within the deadline, with the busy time of the same
        interval. A device whose read is still running at the deadline is skipped (deadline)
        and marked stale, its last values kept; it gets no new read until that one returns,
        and the busy time meanwhile goes to the read that follows."""
        for device, per in busy.items():
            if device in self._busy:
                _add(self._busy[device], per)
        for device in self._devices:
            if device.id not in self._reads:
                self._reads[device.id] = _Read(self._read_device, device, self._root, self._clock)
        until = time.monotonic() + self._deadline
        skipped: Counter[str] = Counter()
        for device in self._devices:
            job = self._reads[device.id]
            if not job.done.wait(max(0.0, until - time.monotonic())):
                skipped[DEADLINE] += 1
                self._stale(device)
                continue
            del self._reads[device.id]
            streak = self._streaks[device.id]
            if job.reading is None:
                streak.failed(job.error or RuntimeError("no reading"))
                skipped[str(Skip.UNREADABLE)] += 1
                self._stale(device)
            else:
                streak.ok()
                skipped.update(job.reading.skipped)
                if reason := self._account(device, job.reading, job.at_ns):
                    skipped[reason] += 1
        for reason, n in skipped.items():
            if n:
                self._metrics.set(SKIPS, reason, n)

    def _account(self, device: Device, reading: Reading, now: int) -> str | None:
        """The device's series and energy split from a finished read; the skip reason of an
        energy counter step not taken as it reads (kubenpu.sources.energy.step)."""
        meter = self._meters[device.id]
        delta, reason = meter.delta(reading.energy_uj, reading.power_uw, now, reading.limit_uw)
        busy, self._busy[device.id] = self._busy[device.id], {}
        if delta is not None and meter.at_ns is not None:
            self._split(meter, delta, now - meter.at_ns, busy)
            if reading.power_uw is None and now > meter.at_ns:  # i915, xe: no power file
                power = delta * 1e3 / (now - meter.at_ns)
                attrs = {"sensor": "energy", "chip": "", "source": "derived"}
                reading.values.append((POWER, attrs, power))
        meter.at_ns = now
        points = self._points(self._hw[device.id], meter, reading)
        state = self._state(device, reading)
        hw = {**self._hw[device.id], **reading.descriptive}
        points += [(DEVICE_STATUS, {**hw, "state": s}, float(s == state)) for s in STATES]
        self._last[device.id] = points
        self._metrics.set(TELEMETRY, device.id, [*points, self._stale_point(device, 0.0)])
        return reason

    def _state(self, device: Device, reading: Reading) -> str:
        """hw.state by the rule of docs/metrics.md#device-health."""
        return "failed" if self._wedged(device.id) else health(reading)

    def _stale(self, device: Device) -> None:
        """The device's last values stay, marked stale."""
        points = self._last.get(device.id, [])
        self._metrics.set(TELEMETRY, device.id, [*points, self._stale_point(device, 1.0)])

    def _stale_point(self, device: Device, value: float) -> tuple[Spec, Attrs, float]:
        hw = self._hw[device.id]
        return (TELEMETRY_STALE, {"device": hw["device"], "vendor": hw["vendor"]}, value)

    def _split(
        self,
        meter: energy.Meter[Where],
        delta: int,
        interval_ns: int,
        busy: Mapping[Where | None, list[int]],
    ) -> None:
        for where, share in meter.split(delta, interval_ns, busy).items():
            if not isinstance(where, Where):
                continue  # the idle and unattributed shares are the meter's
            if not self._metrics.put(POD_ENERGY_SHARES, where, "", share):  # past a double
                self._metrics.set(USAGE_SKIPS, Skip.OUT_OF_RANGE, 1)  # as an engine counter's

    @staticmethod
    def _points(hw: Attrs, meter: energy.Meter[Where], reading: Reading) -> Points:
        hw = {**hw, **reading.descriptive}
        points = [(s, _component(s, hw, attrs), v) for s, attrs, v in reading.values]
        if meter.source:
            points.append((ENERGY, {**hw, "source": meter.source}, meter.total_uj / 1e6))
            own = {"device": hw["device"], "vendor": hw["vendor"]}
            points.append((ENERGY_IDLE, own, meter.idle_uj / 1e6))
            points.append((ENERGY_UNATTRIBUTED, own, meter.unattributed_uj / 1e6))
        return points


def _component(spec: Spec, hw: Attrs, attrs: Attrs) -> Attrs:
    """A point's attributes: a device's telemetry has the device's; a sensor, a component of
    its own (semconv), its own hw.id (the device's, chip and sensor), hw.type and hw.parent
    (the device), and none of the device's hw.name, hw.vendor, model, serial or firmware:
    those describe the parent, which hw.parent names. device and vendor stay, our labels to
    join on."""
    kind = _SENSOR_TYPES.get(spec)
    if kind is None:
        return {**hw, **attrs}
    own = f"{hw['hw.id']}/{attrs.get('chip') or 'hwmon'}/{attrs.get('sensor')}"
    parent = {"device": hw["device"], "vendor": hw["vendor"]}
    return {**parent, **attrs, "hw.id": own, "hw.type": kind, "hw.parent": hw["hw.id"]}


def _hw_attrs(device: Device) -> Attrs:
    """The device's hw.* attributes. hw.type is npu for accel devices: semconv has no NPU type
    yet, and its values are open (a custom one where none applies)."""
    vendor_id = (device.pci_id or "").partition(":")[0]
    accel = any(n.accel for n in device.nodes)
    # A PCI vendor id is no vendor's name: one not in the table leaves hw.vendor off.
    vendor = _HW_VENDOR.get(vendor_id) or _PLATFORM_VENDORS.get(device.driver or "")
    hw: Attrs = {
        "device": device.id,
        "vendor": device.vendor or "",
        "hw.id": device.id,
        "hw.type": "npu" if accel else "gpu",
        "hw.name": device.nodes[0].name if device.nodes else device.id,
    }
    if vendor:  # semconv leaves out what is not known: no empty string
        hw["hw.vendor"] = vendor
    return hw


def build(node: Node) -> Telemetry | None:
    """The telemetry source, if `telemetry.enabled`: its thread reads at each tick, after the
    fdinfo read whose busy time splits the energy; a device the uevents source saw wedged is
    reported failed."""
    cfg = node.cfg
    if not cfg.telemetry.enabled:
        return None
    usage, wedges = node.built.get("fdinfo"), node.built.get("uevents")
    return Telemetry(
        node.watched,
        node.table,
        cfg.discovery.root,
        deadline=cfg.telemetry.deadline_seconds,
        wedged=wedges.wedged if isinstance(wedges, Wedges) else lambda device: False,
        busy=usage.interval_busy if isinstance(usage, Usage) else dict,
        # A step per fdinfo interval: three missed, and the read's deadline, is a stall.
        stale_after=3 * cfg.fdinfo.interval_seconds + cfg.telemetry.deadline_seconds,
    )
