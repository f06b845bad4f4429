"""The placement count (docs/placement.md) on real kernels in QEMU, on the two-node machine
(KUBENPU_VM_NUMA=1: CPUs 0-1 on node 0, 2-3 on node 1, the virtio GPU behind a PCI expander
bridge on node 1): boots one kernel each and runs tests/vm/placement_guest.py.

A pod pinned to node 0's CPUs makes N calls on the GPU: all N remote; pinned to node 1's: none;
unpinned (four processes at once): calls = remote + local, and both equal a bpftrace reference
of each call's CPU and NUMA node on the same hook. Its own boot: the e2e, node and
least-privilege boots check the GPU at the default machine's address (0000:00:02.0), which the
NUMA machine's expander bridge changes.
Kernels: KUBENPU_PLACEMENT_KERNELS (default "6.1 6.12 7.3").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from guest import ROOT

KERNELS = os.environ.get("KUBENPU_PLACEMENT_KERNELS", "6.1 6.12 7.3").split()

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module", params=KERNELS)
def result(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"placement-{request.param}")
    script = [str(ROOT / "tests/vm/run.sh"), request.param, "/src/tests/vm/placement.sh", str(out)]
    env = {**os.environ, "KUBENPU_VM_NUMA": "1"}
    proc = subprocess.run(script, env=env, check=False)
    assert proc.returncode == 0, f"guest run failed on {request.param}; see {out}/console.log"
    return json.loads((Path(out) / "result.json").read_text())


def _key(result: dict, pod: str) -> dict:
    """The pod's one key on the GPU (drmcall's call is one kind)."""
    [key] = result["keys"][pod]
    return key


def _reference(result: dict, pod: str) -> list[list[int]]:
    cgroup_id = result["cgroup_ids"][pod]
    return [row for row in result["reference"] if row[0] == cgroup_id]


def test_the_gpu_is_on_node_1(result):
    assert result["device"]["numa_node"] == 1
    assert result["local_cpulist"] == "2-3" and result["node_cpus"]["1"] == [2, 3]


def test_a_pod_pinned_to_the_other_node_makes_only_remote_calls(result):
    n = result["calls_per_process"]
    assert _key(result, "node0") == {"kind": 2, "calls": n, "remote": n}


def test_a_pod_pinned_to_the_devices_node_makes_none(result):
    n = result["calls_per_process"]
    assert _key(result, "node1") == {"kind": 2, "calls": n, "remote": 0}


@pytest.mark.parametrize("pod", ["node0", "node1", "unpinned"])
def test_each_calls_node_is_the_references(result, pod):
    """bpftrace saw each call's CPU and node on the same hook: its node is the CPU's (sysfs),
    and the kernel's remote and local calls are the reference's off and on node 1."""
    cpus = {int(node): set(c) for node, c in result["node_cpus"].items()}
    rows = _reference(result, pod)
    assert all(cpu in cpus[numa] for _, cpu, numa, _ in rows)
    key = _key(result, pod)
    remote = sum(n for _, _, numa, n in rows if numa != result["device"]["numa_node"])
    local = sum(n for _, _, numa, n in rows if numa == result["device"]["numa_node"])
    assert (key["remote"], key["calls"] - key["remote"]) == (remote, local)
    assert key["calls"] == result["calls_per_process"] * result["processes"][pod]
