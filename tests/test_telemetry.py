"""Device telemetry (kubenpu.sources.telemetry) on the fixture machines, and energy per pod
(kubenpu.sources.energy) from real fdinfo reads (tests/test_usage.py's Machine) on them.

The clock is the test's: intervals are exact numbers of ns, so every split is known exactly.
"""

from __future__ import annotations

import logging
import random
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
from helpers import calls, eventually, make_config, scrape, start_telemetry, values
from otlp_receiver import OtlpReceiver
from prometheus_client.parser import text_string_to_metric_families
from test_usage import POD_A, POD_B, Machine

from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import (
    DEVICE_BUSY,
    DEVICE_ERRORS,
    DEVICE_STATUS,
    ENERGY,
    ENERGY_IDLE,
    ENERGY_UNATTRIBUTED,
    FREQUENCY,
    IOCTL_SERIES,
    MEMORY_BUSY,
    MEMORY_LIMIT,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    OVERFLOW_SERIES,
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
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.series import Series
from kubenpu.sources import energy
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import Reading, read_device
from kubenpu.sources.telemetry import POD_ENERGY_SHARES, Telemetry

TESTDATA = Path(__file__).parent / "testdata"
SECOND = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000 * SECOND

    def __call__(self) -> int:
        return self.ns


def reading(machine: str, device: str):  # type: ignore[no-untyped-def]
    root = TESTDATA / machine
    [dev] = [d for d in discover(root) if d.id == device]
    return read_device(dev, root)


def find(machine: str, device: str, spec: Spec, **attrs: str) -> float:
    found = [
        v for s, a, v in reading(machine, device).values if s is spec and attrs.items() <= a.items()
    ]
    assert len(found) == 1, (spec.name, attrs, found)
    return found[0]


# Every fixture driver, one value per kind it publishes, converted exactly.
@pytest.mark.parametrize(
    ("machine", "device", "spec", "attrs", "value"),
    [
        ("intel-i915", "0000:00:02.0", FREQUENCY, {"state": "actual"}, 300e6),
        ("intel-i915", "0000:00:02.0", FREQUENCY, {"state": "max"}, 1100e6),
        ("intel-i915", "0000:00:02.0", THROTTLE, {"reason": "pl1"}, 1),
        (
            "intel-arc-xe",
            "0000:03:00.0",
            POWER_LIMIT,
            {"sensor": "power1", "limit": "critical"},
            400,
        ),
        ("intel-arc-xe", "0000:03:00.0", POWER_LIMIT, {"sensor": "power1", "limit": "max"}, 0),
        (
            "intel-arc-xe",
            "0000:03:00.0",
            POWER_LIMIT,
            {"sensor": "power2", "limit": "rated_max"},
            150,
        ),
        ("intel-arc-xe", "0000:03:00.0", TEMPERATURE, {"sensor": "temp3"}, 52),
        ("intel-arc-xe", "0000:03:00.0", FREQUENCY, {"state": "rp0"}, 2850e6),
        ("intel-arc-xe", "0000:03:00.0", THROTTLE, {"reason": "thermal"}, 0),
        ("amd-server", "0000:c3:00.0", POWER, {"sensor": "PPT"}, 63),
        ("amd-server", "0000:c3:00.0", POWER_LIMIT, {"limit": "throttled"}, 327),
        ("amd-server", "0000:c3:00.0", TEMPERATURE, {"sensor": "junction"}, 47),
        ("amd-server", "0000:c3:00.0", FREQUENCY, {"domain": "mclk"}, 456e6),
        ("amd-server", "0000:c3:00.0", UTILIZATION, {"task": "general"}, 0.37),
        ("amd-server", "0000:c3:00.0", MEMORY_BUSY, {}, 0.05),
        ("amd-server", "0000:c3:00.0", TEMPERATURE_LIMIT, {"limit": "high.critical"}, 100),
        ("amd-server", "0000:c3:00.0", TEMPERATURE_LIMIT, {"limit": "high.emergency"}, 105),
        (
            "amd-server",
            "0000:c3:00.0",
            MEMORY_UTILIZATION,
            {"region": "vram"},
            (1 << 30) / 25753026560,
        ),
        ("amd-server", "0000:c3:00.0", MEMORY_USED, {"region": "vram"}, 1 << 30),
        ("amd-server", "0000:c3:00.0", MEMORY_LIMIT, {"region": "vram"}, 25753026560),
        ("amd-server", "0000:c3:00.0", DEVICE_ERRORS, {"block": "umc", "type": "corrected"}, 3),
        ("amd-server", "0000:c3:00.0", DEVICE_ERRORS, {"block": "umc", "type": "deferred"}, 0),
        ("amd-server", "0000:c3:00.0", DEVICE_ERRORS, {"block": "gfx", "type": "uncorrected"}, 0),
        ("intel-npu", "0000:00:0b.0", DEVICE_BUSY, {}, 81.234567),
        ("intel-npu", "0000:00:0b.0", FREQUENCY, {"domain": "npu", "state": "max"}, 1850e6),
        ("intel-npu", "0000:00:0b.0", MEMORY_USED, {}, 64 << 20),
        ("gaudi", "0000:33:00.0", POWER, {"chip": "habanalabs"}, 95),
        ("gaudi", "0000:33:00.0", POWER_LIMIT, {"sensor": "max_power"}, 600),
        ("gaudi", "0000:b3:00.0", TEMPERATURE, {}, 39),
        ("gaudi", "0000:b3:00.0", FREQUENCY, {"state": "actual"}, 1600e6),
    ],
)
def test_every_fixture_driver_reads_in_exact_units(machine, device, spec, attrs, value) -> None:
    assert find(machine, device, spec, **attrs) == value
    assert not reading(machine, device).skipped


def test_the_energy_counter_is_the_first_hwmon_first_channel() -> None:
    # xe: energy1 is the card, energy2 the package; the card's is split.
    assert reading("intel-arc-xe", "0000:03:00.0").energy_uj == 123456789012
    assert reading("amd-server", "0000:c3:00.0").energy_uj is None  # amdgpu: power only


def test_bad_files_are_counted_skips_by_reason(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    gpu = next(tmp_path.glob("sys/devices/*/*/0000:c3:00.0"))
    hwmon = gpu / "hwmon/hwmon4"
    (hwmon / "temp1_input").write_text("hot\n")  # malformed
    (hwmon / "temp2_input").write_text("-5000\n")  # below 0 °C is a temperature
    (hwmon / "freq1_input").write_text("99999999999999999999\n")  # past 2^63-1
    (hwmon / "power1_cap").unlink()
    (hwmon / "power1_cap").mkdir()  # a read error (EISDIR), like EIO from a sensor that is off
    (gpu / "gpu_busy_percent").write_text("-3\n")  # a percentage is never negative
    (gpu / "mem_info_vram_used").unlink()  # missing
    [dev] = [d for d in discover(tmp_path) if d.driver == "amdgpu"]
    got = read_device(dev, tmp_path)
    assert dict(got.skipped) == {"malformed": 2, "out_of_range": 1, "unreadable": 1, "missing": 1}
    temperatures = {a["sensor"]: v for s, a, v in got.values if s is TEMPERATURE}
    assert temperatures == {"junction": -5.0, "mem": 56.0}
    assert got.power_uw == 63000000  # the rest is still read


def test_uncorrected_errors_degrade_the_device_and_an_inaccessible_count_is_a_skip(
    tmp_path: Path,
) -> None:
    """amdgpu's RAS counts (ras/<block>_err_count): any uncorrected error makes hw.status
    degraded; a block whose query is not ready says so in words, counted as malformed."""
    tel, metrics, _, root = telemetry("amd-server", tmp_path)
    ras = next(root.glob("sys/devices/*/*/0000:c3:00.0/ras"))
    tel.sample({})
    assert {k[-1] for k, v in values(metrics, DEVICE_STATUS).items() if k[0] == "0000:c3:00.0"} == {
        "ok"
    }
    (ras / "gfx_err_count").write_text("ue: 2\nce: 1\n")
    (ras / "umc_err_count").write_text("Query currently inaccessible\n")
    (ras / "sdma_err_count").write_text("ue: 1\nxe: 4\n")  # an unknown type: the whole file
    tel.sample({})
    errors = values(metrics, DEVICE_ERRORS, skip=("device", "vendor", "hw.id", "hw.type"))
    assert {k[-2:]: v for k, v in errors.items()} == {
        ("gfx", "uncorrected"): 2,
        ("gfx", "corrected"): 1,
    }
    assert values(metrics, TELEMETRY_SKIPPED) == {("malformed",): 2}
    gpu = {k[-1]: v for k, v in values(metrics, DEVICE_STATUS).items() if k[0] == "0000:c3:00.0"}
    assert gpu == {"degraded": 1}


def test_amdgpu_descriptive_files_are_attributes_of_its_points() -> None:
    got = reading("amd-server", "0000:c3:00.0").descriptive
    assert got == {
        "hw.model": "AMD Instinct MI210",
        "hw.serial_number": "692221000312",
        "hw.firmware_version": "113-D67301-063",
    }


def test_power_input_wins_over_average_of_the_same_channel(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    hwmon = next(tmp_path.glob("sys/devices/*/*/0000:c3:00.0/hwmon/hwmon4"))
    (hwmon / "power1_input").write_text("71000000\n")
    [dev] = [d for d in discover(tmp_path) if d.driver == "amdgpu"]
    got = read_device(dev, tmp_path)
    assert [v for s, _, v in got.values if s is POWER] == [71.0]
    assert got.power_uw == 71000000


def telemetry(machine: str, tmp_path: Path) -> tuple[Telemetry, Series, Clock, Path]:
    shutil.copytree(TESTDATA / machine, tmp_path, symlinks=True, dirs_exist_ok=True)
    clock, metrics = Clock(), table(60, 1000)
    return Telemetry(discover(tmp_path), metrics, tmp_path, clock), metrics, clock, tmp_path


def xe_energy(root: Path) -> Path:
    return next(root.glob("sys/devices/**/hwmon2/energy1_input"))


def device_energy(metrics: Series) -> float:
    [(_, value)] = values(metrics, ENERGY).items()
    return value


def test_driver_energy_across_a_reset_and_a_32_bit_wrap(tmp_path: Path) -> None:
    tel, metrics, clock, root = telemetry("intel-arc-xe", tmp_path)
    counter = xe_energy(root)
    # The xe card's highest limit is power1_crit, 400 W: at most 800 W, 4294 J in 6 s.
    for raw, step in ((1_000, 0), (4_000, 5), (500, 5), ((1 << 32) - 100, 6), (400, 5)):
        counter.write_text(f"{raw}\n")
        clock.ns += step * SECOND
        tel.sample({})
    # 3000, then a reset (the 500 since), 4294966796 up to the top, 500 past the wrap.
    assert device_energy(metrics) == (3_000 + 500 + (1 << 32) - 600 + 500) / 1e6
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_reset",): 1}
    # The derived power of the last interval: 500 µJ in 5 s.
    [(_, power)] = [(k, v) for k, v in values(metrics, POWER).items() if "derived" in k]
    assert power == 500 / 5 / 1e6


def energy_steps(tmp_path: Path, steps: list[tuple[int, int]]) -> tuple[Series, int]:
    """The xe card's counter read at (µJ, seconds after the last read), two pods busy half the
    time each: its device energy in µJ and the metrics."""
    tel, metrics, clock, root = telemetry("intel-arc-xe", tmp_path)
    counter = xe_energy(root)
    for raw, seconds in steps:
        counter.write_text(f"{raw}\n")
        clock.ns += seconds * SECOND
        busy = {
            "0000:03:00.0": {
                Where(pod, pod, "", "c", "0000:03:00.0", "xe"): [seconds * SECOND // 2, 0, 0]
                for pod in ("a", "b")
            }
        }
        tel.sample(busy)
    return metrics, round(device_energy(metrics) * 1e6)


def test_a_step_back_to_no_restart_is_implausible_not_a_reset(tmp_path: Path) -> None:
    """1 µJ back on a counter at 10^12 µJ once added 10^12 µJ (1 MJ in 1 s) to the pods."""
    metrics, total = energy_steps(tmp_path, [(10**12, 0), (10**12 - 1, 1), (10**12 + 99, 1)])
    assert total == 100  # the bad step is no energy; the next read goes on from it
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_implausible",): 1}
    assert sum(values(metrics, POD_ENERGY).values()) * 1e6 <= 100


def test_a_rise_past_the_devices_power_is_implausible(tmp_path: Path) -> None:
    big = 1 << 60
    metrics, total = energy_steps(tmp_path, [(5_000, 0), (5_000 + big, 5), (6_000 + big, 5)])
    assert total == 1_000
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_implausible",): 1}
    # 800 W (2 x power1_crit) for 5 s is the most one read takes as real.
    most = energy.POWER_MARGIN * 400 * 5 * 10**6
    metrics, total = energy_steps(tmp_path / "b", [(0, 0), (most, 5), (2 * most + 1, 5)])
    assert total == most
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_implausible",): 1}


def test_a_wide_counter_reset_from_the_top_half_of_32_bits_is_no_wrap(tmp_path: Path) -> None:
    """Once read past 2^32 the counter is 64-bit: a later fall is a reset, not a 32-bit wrap."""
    steps = [(5 << 32, 0), (10, 1), (3_000_000_010, 10), (100, 1)]
    metrics, total = energy_steps(tmp_path, steps)
    assert total == 10 + 3_000_000_000 + 100  # not 2^32 - 3e9 + 100 more for a wrap
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_reset",): 2}


def test_the_ceiling_is_the_margin_over_the_highest_limit_else_the_fallback() -> None:
    assert energy.most_uj(400_000_000, 5 * SECOND) == energy.POWER_MARGIN * 400 * 5 * 10**6
    assert energy.most_uj(None, SECOND) == energy.FALLBACK_WATTS * 10**6
    assert energy.most_uj(0, SECOND) == energy.FALLBACK_WATTS * 10**6
    assert reading("intel-arc-xe", "0000:03:00.0").limit_uw == 400_000_000  # power1_crit
    assert reading("gaudi", "0000:33:00.0").limit_uw == 600_000_000  # habanalabs max_power
    assert reading("intel-i915", "0000:00:02.0").limit_uw is None


def test_power_is_integrated_where_the_driver_has_no_energy_counter(tmp_path: Path) -> None:
    tel, metrics, clock, _ = telemetry("amd-server", tmp_path)
    for _ in range(4):
        tel.sample({})
        clock.ns += 5 * SECOND + 7  # 63 W * 5.000000007 s, remainders carried
    [(key, joules)] = values(metrics, ENERGY).items()
    assert "integrated" in key
    assert joules == 63_000_000 * 3 * (5 * SECOND + 7) // SECOND / 1e6


def test_a_power_reading_past_what_the_device_can_draw_integrates_no_energy(
    tmp_path: Path,
) -> None:
    """2^63-1 µW once added 9.2e18 µJ a second: power is held to the counter's ceiling (2 x
    power1_cap, 654 W here), counted as a skip; the reading just at it still counts."""
    tel, metrics, clock, root = telemetry("amd-server", tmp_path)
    [power] = root.glob("sys/devices/**/hwmon4/power1_average")
    most = energy.POWER_MARGIN * 327_000_000
    for uw in (63_000_000, (1 << 63) - 1, most + 1, most, 63_000_000):
        power.write_text(f"{uw}\n")
        tel.sample({})
        clock.ns += SECOND
    assert device_energy(metrics) == (most + 63_000_000) / 1e6
    assert values(metrics, TELEMETRY_SKIPPED) == {("power_implausible",): 2}


def test_split_sums_exactly_over_many_random_intervals() -> None:
    rng = random.Random(22)
    carry: dict = {}
    given: dict = {}
    total = 0
    for _ in range(2_000):
        interval = rng.choice((0, 1, 5 * SECOND))
        busy = {pod: rng.choice((0, 1, rng.randrange(10 * SECOND))) for pod in "abc"}
        busy[None] = rng.choice((0, rng.randrange(SECOND)))  # pod unknown
        delta = rng.choice((0, 1, 7, rng.randrange(10**9)))
        shares = energy.split(delta, interval, busy, carry)
        assert sum(shares.values()) == delta and min(shares.values(), default=0) >= 0
        total += delta
        for key, share in shares.items():
            given[key] = given.get(key, 0) + share
    assert sum(given.values()) == total
    assert all(0 <= c < len("abc") + 2 for c in carry.values())


def test_split_zero_busy_is_idle_and_busy_past_the_interval_leaves_none_idle() -> None:
    assert energy.split(1000, 5, {"a": 0}, {}) == {energy.IDLE: 1000}
    assert energy.split(1000, 5, {"a": 9, "b": 1}, {}) == {"a": 900, "b": 100}
    assert energy.split(1000, 10, {"a": 2, None: 3}, {}) == {
        "a": 200,
        energy.UNATTRIBUTED: 300,
        energy.IDLE: 500,
    }
    assert energy.split(1000, 0, {}, {}) == {energy.IDLE: 1000}


def test_carried_remainders_favour_no_one() -> None:
    carry: dict = {}
    given = {"a": 0, "b": 0, "c": 0}
    for _ in range(300):
        for key, share in energy.split(1, 0, {"a": 1, "b": 1, "c": 1}, carry).items():
            given[key] += share
    assert given == {"a": 100, "b": 100, "c": 100}
    carry = {}
    assert energy.apportion(10, {"a": 1, "b": 2}, carry) == {"a": 3, "b": 7}
    assert carry == {"a": Fraction(1, 3)}


def cycles(busy: int, elapsed: int) -> str:
    return f"drm-cycles-rcs:\t{busy}\ndrm-total-cycles-rcs:\t{elapsed}\n"


def test_energy_per_pod_from_fdinfo_sums_to_the_device_counter(tmp_path: Path) -> None:
    """Two pods on an xe card (busy cycles, as xe prints them) and a host process."""
    m = Machine(tmp_path, TESTDATA / "intel-arc-xe", driver="xe")
    clock = Clock()
    tel = Telemetry(m.devices, m.metrics, tmp_path, clock)
    counter = xe_energy(tmp_path)
    m.cgroup("pod-a", POD_A)
    m.cgroup("pod-b", POD_B)
    m.cgroup("host", None)
    states = [
        # (pod a busy, pod b busy, host busy, elapsed cycles, energy counter µJ)
        (0, 0, 0, 0, 10_000_000),  # the baseline read
        (300, 100, 0, 1000, 11_000_000),  # 1 J: a 3/10, b 1/10, idle 6/10
        (300, 100, 0, 2000, 12_000_000),  # nothing busy: all idle
        (1300, 1100, 100, 3000, 14_100_000),  # busy 2100 > 1000 elapsed: none idle
        (1300, 1100, 100, 4000, 500_000),  # counter reset: 0.5 J since, all idle
    ]
    for a, b, host, elapsed, counter_uj in states:
        m.process(10, "pod-a", {1: cycles(a, elapsed)})
        m.process(11, "pod-b", {2: cycles(b, elapsed)})
        m.process(12, "host", {3: cycles(host, elapsed)})
        counter.write_text(f"{counter_uj}\n")
        m.usage.saw([10, 11, 12], [])
        m.read()
        clock.ns += 5 * SECOND
        tel.sample(m.usage.interval_busy())
    pods = values(m.metrics, POD_ENERGY, ("namespace", "container", "device", "vendor"))
    idle = values(m.metrics, ENERGY_IDLE)[("0000:03:00.0", "xe")]
    unattributed = values(m.metrics, ENERGY_UNATTRIBUTED)[("0000:03:00.0", "xe")]
    total = device_energy(m.metrics)
    micro = {k: round(v * 1e6) for k, v in pods.items()}
    assert micro == {("a",): 300_000 + 1_000_000, ("b",): 100_000 + 1_000_000}
    assert round(unattributed * 1e6) == 100_000  # the host process waits for the CRI: pending
    assert round(idle * 1e6) == 600_000 + 1_000_000 + 500_000
    assert round(total * 1e6) == 1_000_000 + 1_000_000 + 2_100_000 + 500_000
    assert sum(micro.values()) + round(idle * 1e6) + round(unattributed * 1e6) == round(total * 1e6)


def push_and_scrape(tmp_path: Path, fill: Callable[[Series], None]) -> tuple[OtlpReceiver, str]:
    """fill the agent's series table, push them to a real OTLP receiver and scrape /metrics."""
    with OtlpReceiver() as rx:
        cfg = make_config(
            tmp_path,
            f"export:\n  otlp: {{enabled: true, endpoint: 'http://127.0.0.1:{rx.port}', "
            "interval_seconds: 3600, timeout_seconds: 5}\n",
        )
        exporters = start_telemetry(cfg)
        try:
            fill(exporters.metrics)
            assert exporters.pusher.push()
            text = scrape(cfg.export.prometheus.port)
        finally:
            exporters.shutdown()
    return rx, text


def test_metrics_and_otlp_carry_every_fixture_drivers_telemetry(tmp_path: Path) -> None:
    def fill(metrics: Series) -> None:
        for machine in ("intel-i915", "intel-arc-xe", "amd-server", "intel-npu", "gaudi"):
            root = TESTDATA / machine
            Telemetry(discover(root), metrics, root).sample({})

    rx, text = push_and_scrape(tmp_path, fill)
    samples = {
        (s.name, s.labels["device"], s.labels.get("hw_vendor"))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("kubenpu_device_") and "device" in s.labels
    }
    assert {
        ("kubenpu_device_frequency_hertz", "0000:00:02.0", "Intel"),  # i915
        ("kubenpu_device_frequency_hertz", "0000:03:00.0", "Intel"),  # xe
        ("kubenpu_device_temperature_celsius", "0000:03:00.0", None),  # a sensor: its parent's
        ("kubenpu_device_power_watts", "0000:c3:00.0", "AMD"),  # amdgpu
        ("kubenpu_device_busy_seconds_total", "0000:00:0b.0", "Intel"),  # ivpu
        ("kubenpu_device_power_watts", "0000:33:00.0", "Habana"),  # habanalabs
    } <= samples
    power = rx.metric("hw.power")
    assert power.unit == "W"
    points = {
        (a["device"], a["hw.type"], a["hw.vendor"], a["hw.sensor_location"])
        for a in (
            {kv.key: kv.value.string_value for kv in p.attributes} for p in power.gauge.data_points
        )
    }
    assert points == {
        ("0000:c3:00.0", "gpu", "AMD", "PPT"),
        ("0000:33:00.0", "npu", "Habana", "power1"),
        ("0000:b3:00.0", "npu", "Habana", "power1"),
    }
    assert rx.metric("hw.temperature").unit == "Cel"
    assert rx.metric("hw.gpu.memory.limit").unit == "By"
    assert rx.metric("kubenpu.device.busy").sum.is_monotonic


def test_pod_energy_is_exported_under_its_prometheus_and_otlp_names(tmp_path: Path) -> None:
    where = Where("ns", "a", "", "main", "platform:kubenpu_testdrm", "kubenpu_testdrm")
    rx, text = push_and_scrape(
        tmp_path, lambda metrics: metrics.put(POD_ENERGY_SHARES, where, "", 1_500_001)
    )
    assert 'kubenpu_energy_joules_total{container="main",device="platform:kubenpu_testdrm"' in text
    [(attrs, joules)] = rx.values("kubenpu.energy").items()
    assert joules == 1.500001 and ("k8s.pod.name", "a") in attrs


def test_names_with_other_scripts_digits_are_not_sensors(tmp_path: Path) -> None:
    """A directory hwmon² stopped every device's telemetry: '²'.isdigit() is true and int('²')
    raised. power\\u0661_input read as channel 1 (int('\\u0661'), an Arabic-Indic one, is 1), a
    second power1."""
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    gpu = next(tmp_path.glob("sys/devices/*/*/0000:c3:00.0"))
    before = read_device(*[d for d in discover(tmp_path) if d.driver == "amdgpu"], tmp_path)
    (gpu / "hwmon/hwmon²").mkdir()
    (gpu / "hwmon/hwmon²/power1_input").write_text("5000000\n")
    (gpu / "hwmon/hwmon4/power\u0661_input").write_text("7000000\n")
    [dev] = [d for d in discover(tmp_path) if d.driver == "amdgpu"]
    got = read_device(dev, tmp_path)
    assert got == before
    assert got.power_uw == 63000000


class Sensors:
    """read_device, except that a read of `stuck` blocks until `release` is set, as a sysfs
    read does while the driver resets the device."""

    def __init__(self, stuck: str) -> None:
        self.stuck = stuck
        self.release, self.blocked, self.returned = (threading.Event() for _ in range(3))
        self.started: Counter[str] = Counter()
        self.fail = False

    def __call__(self, device, root: Path) -> Reading:  # type: ignore[no-untyped-def]
        self.started[device.id] += 1
        if self.fail:
            raise OSError("a bug, not sysfs")
        if device.id == self.stuck and self.started[device.id] > 1:
            self.blocked.set()
            self.release.wait()
        reading = read_device(device, root)
        if device.id == self.stuck:
            self.returned.set()
        return reading


DEADLINE = 0.2  # waited for each stuck read; no assertion is on time


def stale(metrics: Series) -> dict[str, float]:
    [points] = [p for s, p in metrics.collect() if s is TELEMETRY_STALE]
    return {p.attrs["device"]: p.value for p in points}


def read_until_fresh(tel: Telemetry, metrics: Series, device: str) -> None:
    """Reads until the device's late read is used (it returns a moment after the fake's read)."""
    eventually(lambda: tel.sample({}) is None and stale(metrics)[device] == 0, "the late read used")


def test_a_read_that_blocks_is_skipped_its_device_marked_stale_and_never_read_twice(
    tmp_path: Path,
) -> None:
    """A sysfs read that never returned (a driver blocks them during a GPU reset) held up every
    device's telemetry, and with it counting."""
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    sensors, metrics = Sensors("0000:c3:00.0"), table(60, 1000)
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock(), DEADLINE, sensors)
    try:
        tel.sample({})
        assert stale(metrics) == {"0000:02:00.0": 0, "0000:c3:00.0": 0}
        hwmon = next(tmp_path.glob("sys/devices/*/*/0000:c3:00.0/hwmon/hwmon4"))
        (hwmon / "power1_average").write_text("70000000\n")
        for _ in range(2):  # stuck: skipped at each read, and no second read started
            tel.sample({})
        assert sensors.blocked.is_set()
        assert sensors.started == {"0000:02:00.0": 3, "0000:c3:00.0": 2}
        assert values(metrics, TELEMETRY_SKIPPED) == {("deadline",): 2}
        assert stale(metrics) == {"0000:02:00.0": 0, "0000:c3:00.0": 1}
        [power] = [v for k, v in values(metrics, POWER).items() if "0000:c3:00.0" in k]
        assert power == 63.0  # the last values stay
    finally:
        sensors.release.set()
    assert sensors.returned.wait(30)
    read_until_fresh(tel, metrics, "0000:c3:00.0")  # the read that took long is used
    assert stale(metrics) == {"0000:02:00.0": 0, "0000:c3:00.0": 0}
    assert [v for k, v in values(metrics, POWER).items() if "0000:c3:00.0" in k] == [70.0]
    tel.sample({})
    assert sensors.started["0000:c3:00.0"] == 3


def test_busy_time_handed_while_a_read_is_stuck_is_split_at_the_read_after(
    tmp_path: Path,
) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    sensors, metrics, clock = Sensors("0000:03:00.0"), table(60, 1000), Clock()
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, clock, DEADLINE, sensors)
    counter = xe_energy(tmp_path)
    a = Where("ns", "a", "", "c", "0000:03:00.0", "xe")

    def busy(seconds: int) -> dict:
        return {"0000:03:00.0": {a: [seconds * SECOND, 0, 0]}}

    counter.write_text("1000000\n")
    tel.sample(busy(0))
    clock.ns += 5 * SECOND  # the stuck read returns 5 s after the first
    try:
        tel.sample(busy(2))
    finally:
        counter.write_text("4000000\n")
        sensors.release.set()
    assert sensors.returned.wait(30)
    tel.sample(busy(3))  # 2 s + 3 s busy of 5 s: all of the 3 J is a's
    read_until_fresh(tel, metrics, "0000:03:00.0")
    assert values(metrics, POD_ENERGY, ("namespace", "container", "device", "vendor")) == {
        ("a",): 3.0
    }
    assert values(metrics, ENERGY_IDLE) == {}


def status(metrics: Series) -> dict[tuple[str, str], float]:
    """hw.status by (device, state), zeros included."""
    [points] = [p for s, p in metrics.collect() if s is DEVICE_STATUS]
    return {(p.attrs["device"], p.attrs["state"]): p.value for p in points}


def test_a_full_cap_keeps_each_devices_status_and_stale_flag(tmp_path: Path) -> None:
    """metrics.max_series full of pods' calls leaves telemetry no room: a read keeps the
    device's state all the same (hw.status and kubenpu_device_telemetry_stale, a few series
    past the cap) and leaves its other points out, counted by source. A full cap must not hide
    that a device failed or that its telemetry went stale (docs/metrics.md, The series cap)."""
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    gpu, wedged = "0000:03:00.0", [False]
    sensors, metrics = Sensors(""), table(60, 2)
    calls(metrics, "ns", "a", "c")
    calls(metrics, "ns", "b", "c")  # the cap is full
    devices, clock = discover(tmp_path), Clock()
    tel = Telemetry(
        devices, metrics, tmp_path, clock, DEADLINE, sensors, wedged=lambda d: wedged[0]
    )

    def kept() -> set[Spec]:
        return {s for s, points in metrics.collect() if s in TELEMETRY_SPECS and points}

    tel.sample({})
    assert kept() == {DEVICE_STATUS, TELEMETRY_STALE}
    assert status(metrics) == {(gpu, "ok"): 1, (gpu, "degraded"): 0, (gpu, "failed"): 0}
    assert stale(metrics) == {gpu: 0}
    uncapped = table(60, 1000)
    Telemetry(discover(tmp_path), uncapped, tmp_path, Clock()).sample({})
    every = sum(len(points) for s, points in uncapped.collect() if s in TELEMETRY_SPECS)
    state = 3 + 1  # ok, degraded, failed; stale
    assert values(metrics, OVERFLOW_SERIES) == {("telemetry",): every - state}
    wedged[0] = True  # a DRM wedged uevent asked for a recovery
    tel.sample({})
    assert status(metrics) == {(gpu, "ok"): 0, (gpu, "degraded"): 0, (gpu, "failed"): 1}
    sensors.stuck = gpu  # the next read blocks, as sysfs does during a reset
    try:
        tel.sample({})
        assert sensors.blocked.is_set()
        assert kept() == {DEVICE_STATUS, TELEMETRY_STALE}
        assert stale(metrics) == {gpu: 1}
        assert status(metrics)[(gpu, "failed")] == 1  # the last read's state, kept with it
    finally:
        sensors.release.set()
    assert sensors.returned.wait(30)
    assert values(metrics, IOCTL_SERIES) == {(): 2}  # the pods' calls keep their series


def test_a_read_that_raises_is_counted_and_the_next_one_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    sensors, metrics = Sensors(""), table(60, 1000)
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock(), DEADLINE, sensors)
    tel.start()
    skipped = {("unreadable",): 2}
    try:
        with caplog.at_level(logging.INFO, logger="kubenpu.sources.telemetry"):
            sensors.fail = True
            for _ in range(2):
                tel.submit({})
                eventually(lambda: values(metrics, TELEMETRY_SKIPPED) or None, "a failed read")
            eventually(lambda: values(metrics, TELEMETRY_SKIPPED) == skipped, "two failed reads")
            assert stale(metrics) == {"0000:03:00.0": 1}
            sensors.fail = False
            tel.submit({})
            eventually(lambda: stale(metrics) == {"0000:03:00.0": 0}, "the next read")
    finally:
        tel.close()
    # Once a streak, not once a read: a read failing each interval flooded the log.
    failures = [r for r in caplog.records if "failed (retrying)" in r.getMessage()]
    assert [r.getMessage() for r in failures] == [
        "reading the telemetry of 0000:03:00.0 failed (retrying): OSError: a bug, not sysfs"
    ]
    assert "0000:03:00.0 works again after 2 failure(s)" in caplog.text


def test_energy_step_at_the_wrap_and_reset_boundaries() -> None:
    """Each edge of the 32-bit wrap rule and the restart rule, one value either side (mutmut
    found them untested)."""
    wrap = 1 << 32
    # last exactly 2^32 is not a 32-bit counter's top half: a fall from it is a restart
    assert energy.step(wrap, 5, 10**12, False) == (5, energy.COUNTER_RESET)
    # last exactly 2^31 is the top half's first value: a fall from it is a wrap
    assert energy.step(1 << 31, 10, (1 << 31) + 10, False) == ((1 << 31) + 10, None)
    # last just below 2^31 is the bottom half: a fall to 0 is a restart, not a wrap
    assert energy.step((1 << 31) - 1, 0, wrap, False) == (0, energy.COUNTER_RESET)
    # a wrap that made exactly the most the device could make is taken
    assert energy.step(wrap - 10, 5, 15, False) == (15, None)
    # a restart to exactly the most the device could make since is taken
    assert energy.step(100, 50, 50, False) == (50, energy.COUNTER_RESET)
