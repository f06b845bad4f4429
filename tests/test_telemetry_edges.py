"""kubenpu.sources.telemetry at its edges (from mutmut's survivors): labels and block names outside
the allowed characters or over their cut, limits and sizes of zero, skips counted per file and per
device, a device whose read overruns once, the energy no pod holds, and a thread that fails.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest
from helpers import values
from test_telemetry import SECOND, TESTDATA, Clock, telemetry, xe_energy

from kubenpu.discovery import Device, discover
from kubenpu.metrics.catalogue import (
    ENERGY_UNATTRIBUTED,
    MEMORY_UTILIZATION,
    TELEMETRY_SKIPPED,
    TELEMETRY_STALE,
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    THROTTLE,
)
from kubenpu.metrics.series import Series
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import MISSING, Reading, read_device
from kubenpu.sources.telemetry import Telemetry

MI = "0000:c3:00.0"  # amd-server's Instinct card (amdgpu): hwmon4, RAS counts, VRAM files
NAVI = "0000:02:00.0"  # amd-server's other card
XE = "0000:03:00.0"


def amd_card(tmp_path: Path) -> tuple[Device, Path]:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    [dev] = [d for d in discover(tmp_path) if d.id == MI]
    return dev, next(tmp_path.glob(f"sys/devices/*/*/{MI}"))


def xe_card(tmp_path: Path) -> tuple[Device, Path]:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    [dev] = discover(tmp_path)
    return dev, next(tmp_path.glob(f"sys/devices/**/{XE}/tile0/gt0/freq0/throttle"))


def test_a_sensor_label_is_cut_to_64_allowed_characters(tmp_path: Path) -> None:
    """hwmon labels are free text (amdgpu: "edge", "junction"; others print spaces and '#')."""
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "hwmon/hwmon4/temp1_label").write_text("GPU core #1 " + "x" * 70 + "\n")
    sensors = {a["sensor"] for s, a, _ in read_device(dev, tmp_path).values if s is TEMPERATURE}
    assert ("GPU_core_1_" + "x" * 53) in sensors


def test_a_ras_block_name_is_cut_to_64_allowed_characters(tmp_path: Path) -> None:
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "ras" / ("mca:" + "u" * 70 + "_err_count")).write_text("ue: 1\nce: 0\n")
    blocks = {
        a["block"] for _, a, _ in (v for v in read_device(dev, tmp_path).values) if "block" in a
    }
    assert ("mca_" + "u" * 60) in blocks


def test_a_memory_size_of_zero_has_no_utilization(tmp_path: Path) -> None:
    """A region the driver sizes 0 (no VRAM carve-out yet) is not divided by."""
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "mem_info_vram_total").write_text("0\n")
    got = read_device(dev, tmp_path)
    assert [v for s, _, v in got.values if s is MEMORY_UTILIZATION] == []


@pytest.mark.parametrize(("cap_uw", "limit_uw"), [("0", None), ("1000000", 1_000_000)])
def test_the_power_limit_is_the_highest_above_zero(
    tmp_path: Path, cap_uw: str, limit_uw: int | None
) -> None:
    """amdgpu prints power1_cap 0 where no cap is set: no limit (the energy check then has no
    maximum power), while any cap above 0 W, 1 W too, is one."""
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "hwmon/hwmon4/power1_cap").write_text(f"{cap_uw}\n")
    assert read_device(dev, tmp_path).limit_uw == limit_uw


def test_a_voltage_critical_limit_is_no_temperature_limit(tmp_path: Path) -> None:
    """hwmon's in<N>_crit (sysfs-interface) is a voltage's: only temp<N>_* limits are kept."""
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "hwmon/hwmon4/in0_crit").write_text("1200\n")
    limits = {
        a["sensor"] for s, a, _ in read_device(dev, tmp_path).values if s is TEMPERATURE_LIMIT
    }
    assert "vddgfx" not in limits and limits  # in0's label; the temperatures' limits stay


def test_unreadable_and_vanished_files_are_counted_one_by_one(tmp_path: Path) -> None:
    dev, device_dir = amd_card(tmp_path)
    hwmon = device_dir / "hwmon/hwmon4"
    for n in (5, 6):
        (hwmon / f"temp{n}_input").mkdir()  # not a regular file: unreadable
    for n in (7, 8):
        (hwmon / f"temp{n}_input").symlink_to(hwmon / f"gone{n}")  # listed, then gone
    skipped = read_device(dev, tmp_path).skipped
    assert (skipped["unreadable"], skipped[MISSING]) == (2, 2)


def test_a_file_is_read_up_to_a_page(tmp_path: Path) -> None:
    """A sysfs attribute is at most a page: what lies past 4096 bytes is not read."""
    dev, device_dir = amd_card(tmp_path)
    (device_dir / "hwmon/hwmon4/temp1_input").write_text("45000" + " " * 5000 + "junk\n")
    assert 45.0 in [v for s, _, v in read_device(dev, tmp_path).values if s is TEMPERATURE]


def test_a_throttle_reason_malformed_or_gone_is_counted_and_the_others_kept(
    tmp_path: Path,
) -> None:
    dev, throttle = xe_card(tmp_path)
    (throttle / "reason_pl1").write_text("yes\n")
    (throttle / "reason_pl2").unlink()
    (throttle / "reason_pl2").symlink_to(throttle / "gone")
    got = read_device(dev, tmp_path)
    assert (got.skipped["malformed"], got.skipped[MISSING]) == (1, 1)
    reasons = {a["reason"] for s, a, _ in got.values if s is THROTTLE}
    assert "thermal" in reasons and not reasons & {"pl1", "pl2"}


def test_close_before_start_returns() -> None:
    Telemetry([], table(60, 1000)).close()


def test_a_failed_read_is_logged_with_its_reason_and_the_thread_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    calls = []

    def wall() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("clock gone")
        return 1.0

    tel = Telemetry(discover(tmp_path), table(60, 1000), tmp_path, Clock(), wall=wall)
    caplog.set_level(logging.INFO, "kubenpu")
    tel.start()
    try:
        tel.submit({})
        _wait(lambda: "works again" in caplog.text, tel.submit)
    finally:
        tel.close()
    assert "reading telemetry failed (retrying): RuntimeError: clock gone" in caplog.text


def _wait(done, poke) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):
        if done():
            return
        poke({})
        threading.Event().wait(0.01)
    raise AssertionError("not done")


def test_the_energy_no_pod_holds_is_unattributed(tmp_path: Path) -> None:
    tel, metrics, clock, root = telemetry("intel-arc-xe", tmp_path)
    counter = xe_energy(root)
    counter.write_text("1000000\n")
    tel.sample({})
    clock.ns += 5 * SECOND
    counter.write_text("4000000\n")
    tel.sample({XE: {None: [5 * SECOND, 0, 0]}})  # busy the whole interval, owner unknown
    assert values(metrics, ENERGY_UNATTRIBUTED) == {(XE, "xe"): 3.0}


def _two_cards(tmp_path: Path, read) -> tuple[Telemetry, Series]:  # type: ignore[no-untyped-def]
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics = table(60, 1000)
    devices = sorted(discover(tmp_path), key=lambda d: d.id != MI)  # MI first
    return Telemetry(devices, metrics, tmp_path, Clock(), deadline=0.05, read=read), metrics


def test_each_device_over_the_deadline_is_counted_and_the_next_still_read(tmp_path: Path) -> None:
    release = threading.Event()

    def read(device: Device, root: Path) -> Reading:
        if device.id == MI:
            release.wait(10)  # a driver in a GPU reset
        return read_device(device, root)

    tel, metrics = _two_cards(tmp_path, read)
    tel.sample({})
    assert values(metrics, TELEMETRY_SKIPPED) == {("deadline",): 1}
    assert _all(metrics, TELEMETRY_STALE) == [(NAVI, 0.0), (MI, 1.0)]  # the next card was read
    release.set()
    tel.sample({})  # the stuck read came back: taken, and the device no longer stale
    assert _all(metrics, TELEMETRY_STALE) == [(NAVI, 0.0), (MI, 0.0)]


def test_two_devices_skipped_for_one_reason_count_two(tmp_path: Path) -> None:
    never = threading.Event()
    tel, metrics = _two_cards(tmp_path, lambda device, root: never.wait(10) or Reading())
    tel.sample({})
    assert values(metrics, TELEMETRY_SKIPPED) == {("deadline",): 2}
    never.set()


def test_two_failed_reads_count_two_unreadable(tmp_path: Path) -> None:
    def read(device: Device, root: Path) -> Reading:
        raise OSError("reset in progress")

    tel, metrics = _two_cards(tmp_path, read)
    tel.sample({})
    assert values(metrics, TELEMETRY_SKIPPED) == {("unreadable",): 2}


def test_two_implausible_counters_count_two(tmp_path: Path) -> None:
    """Both cards' counters step back from 10^12 uJ by 1 uJ: no restart starts that high."""
    energy = iter([10**12, 10**12, 10**12 - 1, 10**12 - 1])
    tel, metrics = _two_cards(tmp_path, lambda device, root: Reading(energy_uj=next(energy)))
    tel.sample({})
    tel.sample({})
    assert values(metrics, TELEMETRY_SKIPPED) == {("counter_implausible",): 2}


def _all(metrics: Series, spec: object) -> list[tuple[str, float]]:
    """Every point of spec by device, zeros too (values() leaves them out)."""
    [points] = [p for s, p in metrics.collect() if s is spec]
    return sorted((p.attrs["device"], p.value) for p in points)
