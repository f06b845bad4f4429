"""Attribution against a real containerd: boots one kernel and runs tests/vm/node_guest.py.

Real in the guest: the kernel, containerd 1.7 with its CRI plugin and runc (Debian trixie), images
built from local files, BCC and the agent, which asks containerd's own socket for labels. The test
plays kubelet (CRI calls, labels, cgroupfs-driver cgroup parents) and nothing else.
Kernel: KUBENPU_NODE_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from guest import boot
from helpers import by_reason, expected_counts, ioctl_counts

KERNEL = os.environ.get("KUBENPU_NODE_KERNEL", "6.12")
KUBELET_LABELS = (
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
)
POD_A = ("team-a", "trainer-0")
MAIN = (*POD_A, "main")

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = boot(KERNEL, "/src/tests/vm/node.sh", tmp_path_factory.mktemp(f"node-{KERNEL}"))
    return json.loads((out / "result.json").read_text())


def _value(scrape: dict, metric: str) -> float:
    (sample,) = scrape[metric]
    return sample["value"]


def test_agent_asked_containerd(result):
    """The labels came from containerd's ContainerStatus: one lookup per calling container."""
    assert result["runtime"]["name"] == "containerd"
    assert f"container runtime: containerd {result['runtime']['version']}" in result["agent_log"]
    in_pods = [key for key in result["issued"] if not key.startswith("host/")]
    scrape = result["before_delete"]
    assert _value(scrape, "kubenpu_cri_request_duration_seconds_count") >= len(in_pods)
    assert _value(scrape, "kubenpu_cri_errors_total") == 0


def test_counts_equal_issued_calls(result):
    """Pods before and after the agent, two containers, a restart, a host process: exact."""
    assert ioctl_counts(result["before_delete"]) == expected_counts(result["expected_before"])


def _pod_series(counts: dict[tuple, float], vendor: str, kind: str) -> dict[str, float]:
    """Pod A's counts for one vendor and kind, by container."""
    return {k[2]: v for k, v in counts.items() if k[:2] == POD_A and k[4:] == (vendor, kind)}


def test_two_containers_in_one_pod_are_separate_series(result):
    """main and sidecar both allocate on vgem: one series each, told apart by the container."""
    got = _pod_series(ioctl_counts(result["before_delete"]), "vgem", "alloc")
    assert got == _pod_series(expected_counts(result["expected_before"]), "vgem", "alloc")
    assert set(got) == {"main", "sidecar"}


def test_restarted_container_adds_up_under_the_same_series(result):
    """kubelet's restart is a new container (new id, attempt 1) with the same labels."""
    attempts = [result["containers"][f"team-a/trainer-0/main#{n}"] for n in (0, 1)]
    assert [c["attempt"] for c in attempts] == [0, 1]
    assert attempts[0]["id"] != attempts[1]["id"]
    assert attempts[0]["labels"] == attempts[1]["labels"]
    issued = [result["issued"][f"team-a/trainer-0/main#{n}"] for n in (0, 1)]
    assert issued[0] and issued[1]
    total: Counter[tuple] = Counter()
    for row in issued[0] + issued[1]:
        total[tuple(row["labels"])] += row["value"]
    got = {k[3:]: v for k, v in ioctl_counts(result["before_delete"]).items() if k[:3] == MAIN}
    assert got == total


def test_host_process_is_unattributed_not_pod(result):
    for scrape in ("before_delete", "after_delete"):
        unattributed = by_reason(result[scrape], "kubenpu_unattributed_calls_total")
        assert unattributed == result["expected_unattributed"]
        assert set(unattributed) == {"not_pod"}
        assert by_reason(result[scrape], "kubenpu_events_dropped_total") == {}


def test_deleted_pod_is_retired_after_the_ttl(result):
    after = ioctl_counts(result["after_delete"])
    assert after == expected_counts(result["expected_after"])
    assert not [k for k in after if k[0] == "team-b"]
    assert [k for k in ioctl_counts(result["before_delete"]) if k[0] == "team-b"]


def test_containerd_put_containers_in_kubelet_cgroups(result):
    """cgroupfs driver: containerd makes <cgroup_parent>/<container id>; the agent parses it."""
    for key, c in result["containers"].items():
        path = f"/kubepods/besteffort/pod{c['pod_uid']}/{c['id']}"
        assert c["spec_cgroups_path"] == path, key
        assert c["proc_cgroup"] == f"0::{path}", key


def test_containerd_returns_kubelet_labels(result):
    for key, c in result["containers"].items():
        namespace, pod, rest = key.split("/")
        want = (namespace, pod, c["pod_uid"], rest.partition("#")[0])
        assert tuple(c["labels"][k] for k in KUBELET_LABELS) == want, key
