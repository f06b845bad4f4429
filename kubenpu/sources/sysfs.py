"""Device telemetry from sysfs and hwmon, read once: power, energy, temperature, clocks, memory,
throttling, errors. Pure reads, no thread and no metrics store: the agent's sampler
(kubenpu.sources.telemetry) and `kubenpuctl devices` both read through it.

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
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.files import read_regular
from kubenpu.metrics.catalogue import (
    DEVICE_BUSY,
    DEVICE_ERRORS,
    FREQUENCY,
    MEMORY_BUSY,
    MEMORY_LIMIT,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    THROTTLE,
    UTILIZATION,
    VOLTAGE,
    Attrs,
    Spec,
)
from kubenpu.sources.fdinfo import Skip, parse_number
from kubenpu.text import ascii_digits

# A reading's values: each metric, its attributes and its value in the metric's unit.
Points = list[tuple[Spec, Attrs, float]]
MISSING = "missing"  # the skip reason of a listed file that is absent
_UNITLESS = {"": 1}
_MAX_FILE = 4096  # a sysfs attribute is at most a page
_HWMON = re.compile(
    r"(power|energy|temp|freq|in)(\d+)_(input|average|cap|max|crit|rated_max|emergency)", re.ASCII
)
# hwmon's limit files (Documentation/hwmon/sysfs-interface.rst) as semconv's hw.limit_type
# (model/hardware/registry.yaml; a custom value where none of its values applies).
_POWER_LIMITS = {"cap": "throttled", "max": "max", "crit": "critical", "rated_max": "rated_max"}
_TEMP_LIMITS = {"max": "high.degraded", "crit": "high.critical", "emergency": "high.emergency"}
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
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

    values: Points = field(default_factory=list)
    energy_uj: int | None = None  # the device's energy counter: first hwmon, lowest channel
    power_uw: int | None = None  # its power now: first hwmon, lowest channel
    limit_uw: int | None = None  # its highest power limit, any sensor (POWER_LIMIT's values)
    skipped: Counter[str] = field(default_factory=Counter)
    descriptive: dict[str, str] = field(default_factory=dict)  # catalogue.HW_DESCRIPTIVE
    uncorrected: int = 0  # the driver's uncorrected errors, every block


def health(reading: Reading) -> str:
    """hw.state of a device not wedged: degraded while the driver counts uncorrected errors."""
    return "degraded" if reading.uncorrected else "ok"


def read_device(device: Device, root: str | Path = "/") -> Reading:
    """The telemetry of one device now."""
    reading = Reading()
    dirs = _dirs(device, Path(root))
    if dirs is None:
        return reading
    device_dir, card_dir = dirs
    for hwmon, chip in _chips(_hwmon_dirs(device_dir)):
        _read_hwmon(hwmon, chip, reading)
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


def _chips(hwmons: list[Path]) -> list[tuple[Path, str]]:
    """Each hwmon device with its `chip` label: its name, and for a later chip of a name the
    device already has, the name and an ordinal (amdgpu-2), so two chips' sensors are never
    one series (a sensor's hw.id must be unique). The hwmon ABI forbids '-' in a name."""
    chips: dict[str, Path] = {}
    for hwmon in hwmons:
        name = _text(hwmon / "name") or hwmon.name
        chip, n = name, 1
        while chip in chips:
            n += 1
            chip = f"{name}-{n}"
        chips[chip] = hwmon
    return [(hwmon, chip) for chip, hwmon in chips.items()]


def _read_hwmon(hwmon: Path, chip: str, reading: Reading) -> None:
    try:
        names = sorted(os.listdir(hwmon))
    except OSError:
        reading.skipped[str(Skip.UNREADABLE)] += 1
        return
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
