"""Every telemetry point of every fixture machine (tests/testdata, trees of what each driver
prints, generate.py names the sources), exactly: its metric, every attribute and the value in the
metric's unit, against tests/testdata/telemetry-golden.json.

The file was written by this test (KUBENPU_REGEN=1) and then read line by line against the
fixtures and the hwmon ABI (Documentation/hwmon/sysfs-interface.rst: milli-degrees Celsius,
millivolts, microwatts, microjoules, Hz): each value is its file's number in the metric's unit.
A change to it is a change to what users see, to be read again in review."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubenpu.discovery import discover
from kubenpu.sources.registry import table
from kubenpu.sources.telemetry import Telemetry

TESTDATA = Path(__file__).parent / "testdata"
GOLDEN = TESTDATA / "telemetry-golden.json"
MACHINES = sorted(p.name for p in TESTDATA.iterdir() if (p / "sys").is_dir())
PREFIXES = ("hw.", "kubenpu.npu.", "kubenpu.device.", "kubenpu.telemetry.")


def points(machine: str) -> list[list]:
    root = TESTDATA / machine
    metrics = table(300, 100_000)
    Telemetry(discover(root), metrics, root).sample({})
    return sorted(
        [spec.name, sorted(p.attrs.items()), p.value]
        for spec, found in metrics.collect()
        if spec.name.startswith(PREFIXES)
        for p in found
    )


def test_every_fixture_machines_telemetry_is_as_reviewed() -> None:
    got = {machine: points(machine) for machine in MACHINES}
    got = json.loads(json.dumps(got))  # tuples as lists, as the file holds them
    if os.environ.get("KUBENPU_REGEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("rewrote the golden file")
    want = json.loads(GOLDEN.read_text())
    for machine in MACHINES:
        assert got[machine] == want[machine], machine
    assert set(got) == set(want)
