"""kubenpu.sources.sysfs's reads of a device's files where a driver's tree is odd: the module's
version with control characters, RAS counts over several blocks and one gone, hwmon
directories that cannot be listed (from mutmut's survivors)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from test_telemetry import TESTDATA

from kubenpu.discovery import Device, discover
from kubenpu.metrics.catalogue import TEMPERATURE
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import MISSING, read_device
from kubenpu.sources.telemetry import Telemetry

MI = "0000:c3:00.0"  # amd-server's Instinct card: hwmon4 and RAS counts


def amd_server(tmp_path: Path) -> tuple[Device, Path]:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    [dev] = [d for d in discover(tmp_path) if d.id == MI]
    return dev, next(tmp_path.glob(f"sys/devices/*/*/{MI}"))


def test_the_driver_version_is_printable_ascii_cut_at_128(tmp_path: Path) -> None:
    """/sys/module/<driver>/version is the module's own string: a control character is a space,
    and a label value is at most 128 characters."""
    dev, _ = amd_server(tmp_path)
    version = tmp_path / "sys/module/amdgpu/version"
    version.parent.mkdir(parents=True)
    long = "3.61.0\tbuild " + "7" * 200
    version.write_text(long + "\n")
    got = read_device(dev, tmp_path).descriptive["hw.driver_version"]
    assert got == ("3.61.0 build " + "7" * 200)[:128]


def test_uncorrected_errors_add_up_over_blocks_and_a_vanished_count_is_missing(
    tmp_path: Path,
) -> None:
    """The device's uncorrected total (kubenpuctl devices, hw.status) is every block's; a block
    without uncorrected errors adds none; a count file gone between listing and reading (a
    dangling link, as a driver unbinding leaves) is a missing skip, not a crash."""
    dev, device_dir = amd_server(tmp_path)
    ras = device_dir / "ras"
    (ras / "gfx_err_count").write_text("ue: 2\nce: 1\n")
    (ras / "sdma_err_count").write_text("ce: 4\n")
    (ras / "umc_err_count").write_text("ue: 3\nce: 0\n")
    (ras / "xgmi_wafl_err_count").symlink_to(ras / "gone")
    got = read_device(dev, tmp_path)
    assert got.uncorrected == 5
    assert got.skipped[MISSING] == 1


def test_hwmon_directories_that_cannot_be_listed_are_each_an_unreadable_skip(
    tmp_path: Path,
) -> None:
    dev, device_dir = amd_server(tmp_path)
    for n in (5, 6):
        (device_dir / "hwmon" / f"hwmon{n}").symlink_to(device_dir / f"gone{n}")
    assert read_device(dev, tmp_path).skipped["unreadable"] == 2


def test_two_hwmon_chips_of_one_name_give_distinct_sensor_series(tmp_path: Path) -> None:
    """A second chip named as the first (two amdgpu hwmons under one card) once gave each of its
    sensors the first's labels and hw.id: two series of one identity. The later chip is
    `<name>-2`; the first keeps its name, and a chip of another name is left as it is."""
    dev, device_dir = amd_server(tmp_path)
    hwmon = device_dir / "hwmon"
    for n in (7, 8):
        shutil.copytree(hwmon / "hwmon4", hwmon / f"hwmon{n}", symlinks=True)
    (hwmon / "hwmon8" / "name").write_text("other\n")
    metrics = table(60, 1000)
    Telemetry([dev], metrics, tmp_path).sample({})
    [points] = [p for s, p in metrics.collect() if s is TEMPERATURE]
    assert Counter(p.attrs["chip"] for p in points) == {"amdgpu": 3, "amdgpu-2": 3, "other": 3}
    assert len({p.attrs["hw.id"] for p in points}) == 9
    assert len({frozenset(p.attrs.items()) for p in points}) == 9
