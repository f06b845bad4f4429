"""Device telemetry from sysfs and hwmon: power, energy, temperature, clocks, memory, throttling.

Sources, per discovered device, all readable without privileges:
- the generic hwmon ABI (Documentation/hwmon/sysfs-interface.rst) of every hwmon device whose
  parent is the DRM device: ``device/hwmon/hwmon*/`` with ``powerN_{input,average}`` (µW),
  ``powerN_{cap,max,crit,rated_max}`` (µW), ``energyN_input`` (µJ), ``tempN_input`` (m°C),
  ``freqN_input`` (Hz), ``inN_input`` (mV), ``<type>N_label`` and ``name``;
- each driver's own files, listed as data in DRIVER_FILES (paths checked in the driver sources,
  docs/metrics.md names them).

Every number goes through fdinfo's bounded parser. A listed file that is absent, a read error
(hwmon answers EIO or ENODATA for a sensor that is off), a malformed or out-of-range value is
counted by reason in ``Reading.skipped`` and read as nothing; nothing here raises on sysfs.

``Telemetry`` reads every device on the fdinfo interval on its own ``telemetry`` thread, each
device's files on a daemon thread of their own within ``telemetry.deadline_seconds``: a driver
can block a sysfs read for good (during a GPU reset), and that must hold up neither counting nor
the other devices. It keeps the device's energy counter across wraps and resets (each step held
against the device's highest power limit: kubenpu.energy.step), integrates power where a driver
has no energy counter, and splits each increment among pods (kubenpu.energy) by the busy time
the attribution thread hands it after each fdinfo read.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path

from kubenpu import energy
from kubenpu.discovery import Device
from kubenpu.fdinfo import Skip, parse_number
from kubenpu.files import read_regular
from kubenpu.metrics.catalogue import (
    DEVICE_BUSY,
    DEVICE_ERRORS,
    DEVICE_STATUS,
    ENERGY,
    ENERGY_IDLE,
    ENERGY_UNATTRIBUTED,
    FREQUENCY,
    MEMORY_BUSY,
    MEMORY_LIMIT,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    POD_ENERGY,
    POWER,
    POWER_LIMIT,
    TELEMETRY_SKIPPED,
    TELEMETRY_SPECS,
    TELEMETRY_STALE,
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    THROTTLE,
    UTILIZATION,
    VOLTAGE,
    Attrs,
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.points import Point, Snapshot
from kubenpu.metrics.series import NodeFamily, PodFamily, Series, added, by_label
from kubenpu.services import Streak, Worker
from kubenpu.sources import Node, Report
from kubenpu.text import ascii_digits
from kubenpu.uevents import Wedges
from kubenpu.usage import SKIPS as USAGE_SKIPS
from kubenpu.usage import Usage

log = logging.getLogger(__name__)

MISSING = "missing"
DEADLINE = "deadline"  # a device's read still running at the deadline
_UNITLESS = {"": 1}
_MAX_FILE = 4096  # a sysfs attribute is at most a page
_HWMON = re.compile(
    r"(power|energy|temp|freq|in)(\d+)_(input|average|cap|max|crit|rated_max|emergency)", re.ASCII
)
# hwmon's limit files (Documentation/hwmon/sysfs-interface.rst) as semconv's hw.limit_type
# (model/hardware/registry.yaml; a custom value where none of its values applies).
_POWER_LIMITS = {"cap": "throttled", "max": "max", "crit": "critical", "rated_max": "rated_max"}
_TEMP_LIMITS = {"max": "high.degraded", "crit": "high.critical", "emergency": "high.emergency"}
# The telemetry of a sensor, a component of its own in semconv: its hw.type.
_SENSOR_TYPES = {TEMPERATURE: "temperature", TEMPERATURE_LIMIT: "temperature", VOLTAGE: "voltage"}
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
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
# Driver -> its descriptive files, as catalogue.HW_DESCRIPTIVE attributes. amdgpu:
# amdgpu_fru_eeprom.c (product_name, serial_number from the board's FRU; amdgpu_device.c on
# older kernels), amdgpu_atombios.c (vbios_version). Every
# module with a MODULE_VERSION has /sys/module/<driver>/version (hw.driver_version).
DESCRIPTIVE_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "amdgpu": (
        ("product_name", "hw.model"),
        ("serial_number", "hw.serial_number"),
        ("vbios_version", "hw.firmware_version"),
    ),
}
_DESCRIPTIVE_CHARS = re.compile(r"[^ -~]+")  # printable ASCII only: it is a label value
# Driver -> its error counter files: a directory of <block>_err_count files, each lines of
# "<type>: <count>". amdgpu: amdgpu_ras.c amdgpu_ras_sysfs_read ("ue: %lu\nce: %lu\n", plus
# "de: %lu" for UMC since 6.10; "Query currently inaccessible" while RAS is not ready).
ERROR_FILES = {"amdgpu": "ras"}
_ERROR_TYPES = {"ue": "uncorrected", "ce": "corrected", "de": "deferred"}
_ERROR_SUFFIX = "_err_count"
# hw.status: each state is a point, 1 for the device's state now.
STATES = ("ok", "degraded", "failed")


class Base(Enum):
    """The directory a driver file is under."""

    DEVICE = "device"  # the device's sysfs directory (a DRM node's `device` link)
    CARD = "card"  # the DRM card node's directory (/sys/class/drm/cardN): i915's gt files


@dataclass(frozen=True)
class DriverFile:
    """One value a driver publishes in its own sysfs files."""

    paths: tuple[str, ...]  # alternatives, newest first; one ending in * lists many (reason=)
    spec: Spec
    attrs: tuple[tuple[str, str], ...] = ()
    multiplier: int = 1  # raw * multiplier / divisor is in spec's unit
    divisor: int = 1
    base: Base = Base.DEVICE


def _freq(paths: tuple[str, ...], domain: str, state: str, base: Base) -> DriverFile:
    return DriverFile(paths, FREQUENCY, (("domain", domain), ("state", state)), 1_000_000, 1, base)


_I915_GT = "gt/gt0/"
_XE_FREQ = "tile0/gt0/freq0/"
# Driver -> its own files. i915: gt/intel_gt_sysfs_pm.c (rps_*_freq_mhz, throttle_reason_*;
# gt_*_freq_mhz on the card are the legacy names); xe: xe_gt_freq.c, xe_gt_throttle.c;
# amdgpu: amdgpu_pm.c, amdgpu_vram_mgr.c; ivpu (sysfs name intel_vpu): ivpu_sysfs.c;
# habanalabs: common/sysfs.c (max_power in mW).
DRIVER_FILES: dict[str, tuple[DriverFile, ...]] = {
    "i915": (
        _freq((_I915_GT + "rps_act_freq_mhz", "gt_act_freq_mhz"), "gt0", "actual", Base.CARD),
        _freq((_I915_GT + "rps_cur_freq_mhz", "gt_cur_freq_mhz"), "gt0", "requested", Base.CARD),
        _freq((_I915_GT + "rps_max_freq_mhz", "gt_max_freq_mhz"), "gt0", "max", Base.CARD),
        DriverFile(
            (_I915_GT + "throttle_reason_*",), THROTTLE, (("domain", "gt0"),), base=Base.CARD
        ),
    ),
    "xe": (
        _freq((_XE_FREQ + "act_freq",), "gt0", "actual", Base.DEVICE),
        _freq((_XE_FREQ + "cur_freq",), "gt0", "requested", Base.DEVICE),
        _freq((_XE_FREQ + "max_freq",), "gt0", "max", Base.DEVICE),
        _freq((_XE_FREQ + "min_freq",), "gt0", "min", Base.DEVICE),
        _freq((_XE_FREQ + "rp0_freq",), "gt0", "rp0", Base.DEVICE),
        DriverFile((_XE_FREQ + "throttle/reason_*",), THROTTLE, (("domain", "gt0"),)),
    ),
    "amdgpu": (
        DriverFile(("gpu_busy_percent",), UTILIZATION, (("task", "general"),), divisor=100),
        DriverFile(("mem_busy_percent",), MEMORY_BUSY, divisor=100),
        DriverFile(("mem_info_vram_used",), MEMORY_USED, (("region", "vram"),)),
        DriverFile(("mem_info_vram_total",), MEMORY_LIMIT, (("region", "vram"),)),
    ),
    "intel_vpu": (
        DriverFile(("npu_busy_time_us",), DEVICE_BUSY, divisor=1_000_000),
        _freq(("npu_current_frequency_mhz",), "npu", "actual", Base.DEVICE),
        _freq(("npu_max_frequency_mhz",), "npu", "max", Base.DEVICE),
        DriverFile(("npu_memory_utilization",), MEMORY_USED, (("region", "device"),)),
    ),
    "habanalabs": (
        _freq(("clk_cur_freq_mhz",), "pll", "actual", Base.DEVICE),
        _freq(("clk_max_freq_mhz",), "pll", "max", Base.DEVICE),
        DriverFile(
            ("max_power",),
            POWER_LIMIT,
            (("sensor", "max_power"), ("chip", ""), ("limit", "throttled")),
            divisor=1000,
        ),
    ),
}


@dataclass
class Reading:
    """One read of one device's files."""

    values: list[tuple[Spec, Attrs, float]] = field(default_factory=list)
    energy_uj: int | None = None  # the device's energy counter: first hwmon, lowest channel
    power_uw: int | None = None  # its power now: first hwmon, lowest channel
    limit_uw: int | None = None  # its highest power limit, any sensor (POWER_LIMIT's values)
    skipped: Counter[str] = field(default_factory=Counter)
    descriptive: dict[str, str] = field(default_factory=dict)  # catalogue.HW_DESCRIPTIVE
    uncorrected: int = 0  # the driver's uncorrected errors, every block


@dataclass(frozen=True)
class Summary:
    """What `kubenpuctl devices` shows of a reading: the first sensor of each kind."""

    power_watts: float | None
    temperature_celsius: float | None
    frequency_mhz: float | None
    uncorrected: int | None  # None: the driver publishes no error counts
    health: str  # hw.state by its rule, but for wedged: that takes the agent's uevents

    @classmethod
    def of(cls, reading: Reading) -> Summary:
        def first(spec: Spec, **attrs: str) -> float | None:
            found = (v for s, a, v in reading.values if s is spec and attrs.items() <= a.items())
            return next(found, None)

        freq = first(FREQUENCY, state="actual")
        counted = first(DEVICE_ERRORS) is not None
        return cls(
            first(POWER),
            first(TEMPERATURE),
            None if freq is None else freq / 1e6,
            reading.uncorrected if counted else None,
            _health(reading),
        )


def _health(reading: Reading) -> str:
    """hw.state of a device not wedged: degraded while the driver counts uncorrected errors."""
    return "degraded" if reading.uncorrected else "ok"


def read_device(device: Device, root: str | Path = "/") -> Reading:
    """The telemetry of one device now."""
    reading = Reading()
    dirs = _dirs(device, Path(root))
    if dirs is None:
        return reading
    device_dir, card_dir = dirs
    for hwmon in _hwmon_dirs(device_dir):
        _read_hwmon(hwmon, reading)
    for item in DRIVER_FILES.get(device.driver or "", ()):
        base = device_dir if item.base is Base.DEVICE else card_dir
        if base is not None:
            _read_driver_file(base, item, reading)
    limits = [v for s, _, v in reading.values if s is POWER_LIMIT and v > 0]
    reading.limit_uw = round(max(limits) * 1e6) if limits else None
    reading.values.extend(_memory_utilization(reading.values))
    if folder := ERROR_FILES.get(device.driver or ""):
        _read_errors(device_dir / folder, reading)
    reading.descriptive = _descriptive(device, device_dir, Path(root))
    return reading


def _read_errors(folder: Path, reading: Reading) -> None:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(_ERROR_SUFFIX))
    except OSError:
        return  # no RAS: the board or the kernel has none (amdgpu consumer cards)
    for name in names:
        text = _text(folder / name, reading, missing_ok=False)
        counts = None if text is None else _error_counts(text)
        if counts is None:
            if text is not None:  # "Query currently inaccessible", or not the driver's format
                reading.skipped[str(Skip.MALFORMED)] += 1
            continue
        block = _LABEL_CHARS.sub("_", name.removesuffix(_ERROR_SUFFIX))[:64]
        for kind, n in counts.items():
            reading.values.append((DEVICE_ERRORS, {"block": block, "type": kind}, n))
        reading.uncorrected += counts.get("uncorrected", 0)


def _error_counts(text: str) -> dict[str, int] | None:
    """{type: count} of an err_count file's lines; None unless every line is `<type>: <n>`
    with a known type and a number (the file counts since the driver loaded)."""
    counts = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        number = parse_number(value.strip(), _UNITLESS)
        if not sep or key not in _ERROR_TYPES or isinstance(number, Skip):
            return None
        counts[_ERROR_TYPES[key]] = number
    return counts or None


def _memory_utilization(values: Points) -> Points:
    """Memory used over memory size, per region that has both."""
    sizes = {a.get("region"): v for s, a, v in values if s is MEMORY_LIMIT and v > 0}
    return [
        (MEMORY_UTILIZATION, a, v / sizes[a.get("region")])
        for s, a, v in values
        if s is MEMORY_USED and a.get("region") in sizes
    ]


def _descriptive(device: Device, device_dir: Path, root: Path) -> dict[str, str]:
    driver = device.driver or ""
    files = [(device_dir / name, key) for name, key in DESCRIPTIVE_FILES.get(driver, ())]
    if driver:
        files.append((root / "sys/module" / driver / "version", "hw.driver_version"))
    found = {}
    for path, key in files:
        text = _text(path)
        if text and (value := _DESCRIPTIVE_CHARS.sub(" ", text).strip()[:128]):
            found[key] = value
    return found


def _dirs(device: Device, root: Path) -> tuple[Path, Path | None] | None:
    """The device's sysfs directory and its DRM card node's, through its first node's link."""
    if not device.nodes:
        return None
    card = next((n for n in device.nodes if n.name.startswith("card")), None)
    return device.nodes[0].sysfs(root) / "device", None if card is None else card.sysfs(root)


def _hwmon_dirs(device_dir: Path) -> list[Path]:
    try:
        names = os.listdir(device_dir / "hwmon")
    except OSError:
        return []  # no hwmon device: many drivers register none
    numbered = [(int(n[5:]), n) for n in names if n.startswith("hwmon") and ascii_digits(n[5:])]
    return [device_dir / "hwmon" / n for _, n in sorted(numbered)]


def _read_hwmon(hwmon: Path, reading: Reading) -> None:
    try:
        names = sorted(os.listdir(hwmon))
    except OSError:
        reading.skipped[str(Skip.UNREADABLE)] += 1
        return
    chip = _text(hwmon / "name") or hwmon.name
    channels = sorted(
        (m[1], int(m[2]), m[3], name) for name in names if (m := _HWMON.fullmatch(name))
    )
    # A driver with both (amdgpu on some kernels) gives the same channel twice: input wins.
    inputs = {(kind, channel) for kind, channel, what, _ in channels if what == "input"}
    for kind, channel, what, name in channels:
        if what == "average" and (kind, channel) in inputs:
            continue
        raw = _value(hwmon / name, reading, signed=kind == "temp")
        if raw is None:
            continue
        label = _label(hwmon / f"{kind}{channel}_label") or f"{kind}{channel}"
        attrs = {"sensor": label, "chip": chip}
        if kind == "power" and what in ("input", "average"):
            if reading.power_uw is None:
                reading.power_uw = raw
            reading.values.append((POWER, {**attrs, "source": "driver"}, raw / 1e6))
        elif kind == "power" and what in _POWER_LIMITS:
            limit = _POWER_LIMITS[what]
            reading.values.append((POWER_LIMIT, {**attrs, "limit": limit}, raw / 1e6))
        elif kind == "energy" and what == "input" and reading.energy_uj is None:
            reading.energy_uj = raw  # the other channels (xe's package) are not split
        elif kind == "temp" and what == "input":
            reading.values.append((TEMPERATURE, attrs, raw / 1e3))
        elif kind == "temp" and what in _TEMP_LIMITS:
            limit = {**attrs, "limit": _TEMP_LIMITS[what]}
            reading.values.append((TEMPERATURE_LIMIT, limit, raw / 1e3))
        elif kind == "in" and what == "input":
            reading.values.append((VOLTAGE, attrs, raw / 1e3))
        elif kind == "freq" and what == "input":
            reading.values.append((FREQUENCY, {"domain": label, "state": "actual"}, float(raw)))


def _read_driver_file(base: Path, item: DriverFile, reading: Reading) -> None:
    for path in item.paths:
        if path.endswith("*"):
            _read_glob(base, path, item, reading)
            return
        raw = _value(base / path, reading, missing_ok=True)
        if raw is not None:
            scaled = raw * item.multiplier / item.divisor
            reading.values.append((item.spec, dict(item.attrs), scaled))
            return
        if (base / path).exists():
            return  # present but not used: _value counted why
    reading.skipped[MISSING] += 1


def _read_glob(base: Path, pattern: str, item: DriverFile, reading: Reading) -> None:
    folder, _, prefix = pattern.removesuffix("*").rpartition("/")
    try:
        names = sorted(n for n in os.listdir(base / folder) if n.startswith(prefix))
    except OSError:
        reading.skipped[MISSING] += 1
        return
    for name in names:
        raw = _value(base / folder / name, reading)
        if raw is not None:
            reason = name.removeprefix(prefix)
            reading.values.append((item.spec, {**dict(item.attrs), "reason": reason}, raw))


def _value(
    path: Path, reading: Reading, signed: bool = False, missing_ok: bool = False
) -> int | None:
    text = _text(path, reading, missing_ok)
    if text is None:
        return None
    number = parse_number(text, _UNITLESS, signed=signed)
    if isinstance(number, Skip):
        reading.skipped[str(number)] += 1
        return None
    return number


def _text(path: Path, reading: Reading | None = None, missing_ok: bool = True) -> str | None:
    try:  # regular files only: a FIFO in the tree would block the read for good
        return read_regular(path, _MAX_FILE).decode("ascii").strip()
    except FileNotFoundError:
        if reading is not None and not missing_ok:
            reading.skipped[MISSING] += 1
    except (OSError, UnicodeDecodeError):
        if reading is not None:
            reading.skipped[str(Skip.UNREADABLE)] += 1
    return None


def _label(path: Path) -> str | None:
    text = _text(path)
    return _LABEL_CHARS.sub("_", text)[:64] if text else None


# Busy per recipient in one interval: [busy ns, busy cycles, elapsed cycles].
Busy = Mapping[str, Mapping[Where | None, list[int]]]
_DeviceBusy = dict[Where | None, list[int]]
Points = list[tuple[Spec, Attrs, float]]
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
        energy counter step not taken as it reads (kubenpu.energy.step)."""
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
        return "failed" if self._wedged(device.id) else _health(reading)

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
        points = [(s, {**hw, **_component(s, hw, attrs)}, v) for s, attrs, v in reading.values]
        if meter.source:
            points.append((ENERGY, {**hw, "source": meter.source}, meter.total_uj / 1e6))
            own = {"device": hw["device"], "vendor": hw["vendor"]}
            points.append((ENERGY_IDLE, own, meter.idle_uj / 1e6))
            points.append((ENERGY_UNATTRIBUTED, own, meter.unattributed_uj / 1e6))
        return points


def _component(spec: Spec, hw: Attrs, attrs: Attrs) -> Attrs:
    """A sensor's own attributes: its hw.id (the device's, chip and sensor), hw.type and
    hw.parent (the device); a device's telemetry keeps the device's."""
    kind = _SENSOR_TYPES.get(spec)
    if kind is None:
        return attrs
    own = f"{hw['hw.id']}/{attrs.get('chip') or 'hwmon'}/{attrs.get('sensor')}"
    return {**attrs, "hw.id": own, "hw.type": kind, "hw.parent": hw["hw.id"]}


def _hw_attrs(device: Device) -> Attrs:
    """The device's hw.* attributes. hw.type is npu for accel devices: semconv has no NPU type
    yet, and its values are open (a custom one where none applies)."""
    vendor_id = (device.pci_id or "").partition(":")[0]
    accel = any(n.accel for n in device.nodes)
    vendor = _HW_VENDOR.get(vendor_id, vendor_id) or _PLATFORM_VENDORS.get(device.driver or "")
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
