"""kubenpu.sources.telemetry's thread as the agent runs it: busy time handed over by submit(), the
threads it starts, the health of a wedged device, the derived power's labels, the read's
timestamp (from mutmut's survivors)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from helpers import eventually, values
from test_telemetry import SECOND, TESTDATA, Clock, telemetry, xe_energy

from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import (
    COUNTERS_READ,
    DEVICE_STATUS,
    POD_ENERGY,
    POWER,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.series import Series
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import read_device
from kubenpu.sources.telemetry import Telemetry

XE = "0000:03:00.0"
POD = Where("ns", "a", "", "c", XE, "xe")


def points(metrics: Series, spec: object) -> list:
    [found] = [p for s, p in metrics.collect() if s is spec]
    return found


def test_busy_time_submitted_to_the_running_thread_is_split_and_its_threads_are_daemons(
    tmp_path: Path,
) -> None:
    """The attribution thread hands busy time over with submit() and never waits; the
    telemetry thread reads at once and splits the energy by it. Its threads are daemons (a
    read stuck in sysfs must not hold the agent's exit) and named for thread dumps."""
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics, clock, seen = table(60, 1000), Clock(), []

    def read(device, root):  # type: ignore[no-untyped-def]
        me = threading.current_thread()
        seen.append((me.name, me.daemon))
        return read_device(device, root)

    tel = Telemetry(discover(tmp_path), metrics, tmp_path, clock, read=read)
    counter = xe_energy(tmp_path)
    counter.write_text("1000000\n")
    tel.start()
    try:
        [loop] = [t for t in threading.enumerate() if t.name == "telemetry"]
        assert loop.daemon
        tel.submit({XE: {POD: [0, 0, 0]}})
        eventually(lambda: values(metrics, DEVICE_STATUS) or None, "the baseline read")
        clock.ns += 5 * SECOND
        counter.write_text("4000000\n")
        tel.submit({XE: {POD: [2 * SECOND, 0, 0]}})
        tel.submit({XE: {POD: [3 * SECOND, 0, 0]}})  # the two add up if one read takes both
        pods = ("namespace", "container", "device", "vendor")
        eventually(lambda: values(metrics, POD_ENERGY, pods) == {("a",): 3.0}, "a's 3 J")
    finally:
        tel.close()
    assert not loop.is_alive()  # close() waits for the thread's last read
    assert set(seen) == {(f"telemetry {XE}", True)}


def test_a_wedged_device_is_failed_whatever_its_sensors_say(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics = table(60, 1000)
    wedged = "0000:c3:00.0"
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock(), wedged=lambda d: d == wedged)
    tel.sample({})
    status = {(k[0], k[-1]): v for k, v in values(metrics, DEVICE_STATUS).items()}
    assert status == {(wedged, "failed"): 1, ("0000:02:00.0", "ok"): 1}


def test_power_derived_from_the_energy_counter_says_so_in_its_labels(tmp_path: Path) -> None:
    """xe has no power file: its power is the energy counter's rise over the interval, labelled
    as derived from the energy sensor, with no chip (no hwmon channel stands behind it)."""
    tel, metrics, clock, root = telemetry("intel-arc-xe", tmp_path)
    counter = xe_energy(root)
    for raw in (1_000_000, 6_000_000):
        counter.write_text(f"{raw}\n")
        clock.ns += 5 * SECOND
        tel.sample({})
    derived = [p for p in points(metrics, POWER) if p.attrs.get("source") == "derived"]
    [power] = derived
    assert power.value == 1.0
    assert {"sensor": "energy", "chip": "", "source": "derived"}.items() <= power.attrs.items()


def test_the_threads_read_stamps_the_telemetry_counters_with_its_start(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics = table(60, 1000)
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock(), wall=lambda: 1234.5)
    tel.sample({})  # a read of its own is not stamped: the thread's go through its Report
    assert not points(metrics, COUNTERS_READ)
    tel.start()
    try:
        tel.tick()
        stamps = eventually(
            lambda: {p.attrs["source"]: p.value for p in points(metrics, COUNTERS_READ)} or None,
            "the thread's read stamped",
        )
    finally:
        tel.close()
    assert stamps == {"telemetry": 1234.5}
