"""The placement scheduler (bpf/placement.bpf.c) on a real kernel in QEMU with two NUMA nodes
(KUBENPU_VM_NUMA=1: the virtio GPU's card1 on node 1): tests/vm/scheduler_guest.py runs a
stand-in pod that starts on node 0 and makes ioctls on card1 unpinned, without and then with the
scheduler, in one boot, beside a CPU-bound host task; see that module for the steps.

Kernels: KUBENPU_SCHEDULER_KERNELS (default "7.3": Debian's 6.12 and 6.1 have no sched_ext)."""

from __future__ import annotations

import json
import os

import pytest
from guest import boot

KERNELS = os.environ.get("KUBENPU_SCHEDULER_KERNELS", "7.3").split()
DEVICE_NODE, NODE0_CPUS = 1, (0, 1)
SCHEDULER_CAPS = "SYS_ADMIN+SYS_NICE"  # SYS_ADMIN or BPF + PERFMON, and SYS_NICE

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module", params=KERNELS)
def result(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"scheduler-{request.param}")
    os.environ["KUBENPU_VM_NUMA"] = "1"
    try:
        boot(request.param, "/src/tests/vm/scheduler.sh", out)
    finally:
        del os.environ["KUBENPU_VM_NUMA"]
    return json.loads((out / "result.json").read_text())


def remote_share(run: dict) -> float:
    cpus = run["cpus"]
    return sum(cpus[c] for c in NODE0_CPUS) / sum(cpus)


def test_the_device_is_on_node_1_and_the_kernel_has_sched_ext(result):
    assert result["numa_node"] == DEVICE_NODE and result["local_cpulist"] == "2-3"
    assert result["sched_ext"]


def test_capabilities(result):
    caps = result["caps"]
    loads = {name for name, r in caps.items() if r["load"] == "ok"}
    policies = {name for name, r in caps.items() if r["policy"] == "ok"}
    assert loads == {"BPF+PERFMON", "SYS_ADMIN", "SYS_ADMIN+SYS_NICE"}, caps
    assert policies == {"SYS_NICE", "SYS_ADMIN+SYS_NICE"}, caps
    assert loads & policies == {SCHEDULER_CAPS}


def test_the_scheduler_moves_the_pod_to_its_devices_node(result):
    without, with_ = result["without"], result["with"]
    assert with_["state"] == "enabled" and with_["ops"] == "kubenpu_placement"
    assert with_["switched"] == 1 and with_["policy"] == 7  # SCHED_EXT
    assert remote_share(without) > 0.5, without
    assert remote_share(with_) < remote_share(without) / 4, (without, with_)


def test_a_cpu_bound_host_task_keeps_running(result):
    assert result["without"]["host_loops"] > 0
    assert result["with"]["host_loops"] > 0


def test_killing_the_agent_restores_the_default_scheduler(result):
    assert result["with"]["state_after_kill"] == "disabled"


def test_a_starved_pod_is_never_stuck(result):
    """The pod pinned to the host task's CPU: the fair class runs first, so it waits; either it
    finishes (served when the fair class leaves room) or the watchdog disables the scheduler
    and the fair class runs it. Either way it makes its calls (for its whole run)."""
    stall = result["stall"]
    assert stall["pod"] is not None, stall
    assert sum(stall["pod"]["cpus"]) == stall["pod"]["cpus"][3] > 0
    assert stall["state_after"] == "disabled"
