"""Exactness at the VM's maximum call rate, in both probe modes (one boot; bench/check.sh).

The guest runs a flat-out drmcall burst on every vCPU against each probe mode's agent. Every
issued call must be counted or reported as a drop, and the aggregate mode must drop none. The
same burst runs under each of the benchmark's bpftrace one-liners (its floor arm), whose map must
hold every call: a broken floor arm fails here rather than in `make bench`. The benchmark's
speed figures (bench/) are never asserted: only this accounting is.
Kernel: KUBENPU_BENCH_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os

import pytest
from guest import boot

KERNEL = os.environ.get("KUBENPU_BENCH_KERNEL", "6.12")

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    out = boot(KERNEL, "/src/bench/check.sh", tmp_path_factory.mktemp(f"bench-check-{KERNEL}"))
    return json.loads((out / "check.json").read_text())


@pytest.fixture(scope="module")
def check(found) -> dict:
    return found["modes"]


@pytest.mark.parametrize("mode", ["aggregate", "events"])
def test_counted_plus_dropped_equals_issued(check, mode):
    burst = check[mode]
    assert burst["issued"] > 0
    assert burst["counted"] + sum(burst["dropped"].values()) == burst["issued"], burst


def test_aggregate_mode_drops_nothing_at_max_rate(check):
    burst = check["aggregate"]
    assert burst["dropped"] == {}
    assert burst["counted"] == burst["issued"]


@pytest.mark.parametrize("hook", ["security_file_ioctl", "drm_ioctl"])
def test_bpftrace_floor_counts_every_call(found, hook):
    burst = found["bpftrace"][hook]
    assert burst["issued"] > 0
    assert burst["counted"] == burst["issued"], burst
