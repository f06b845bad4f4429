"""kubenpuctl placement: which pods drive a device from CPUs on another NUMA node than the
device's (docs/placement.md). Per pod and device: the share of its calls that were remote
(kubenpu_ioctl_remote_node_total over kubenpu_ioctl_total, from one agent's /metrics, over a
window or since the agent started), the device's local CPUs (sysfs local_cpulist), the pod's
allowed CPUs (its cgroup's cpuset.cpus.effective), its QoS class (from the kubelet's cgroup
path) and the fix that applies. The CPUs are read on the node the command runs on: run it in
the agent's pod, or on the node, with --root where /sys is mounted elsewhere."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kubenpu import files
from kubenpu.cli.top.sources import DEVICE_INFO, IOCTL, Series, scrape
from kubenpu.metrics.catalogue import IOCTL_REMOTE_NODE
from kubenpu.resolve import containers

REMOTE = IOCTL_REMOTE_NODE.prometheus_name
MOSTLY = 0.5  # the alert's threshold (KubeNPUPodCallsRemote): a fix is named above it
_CGROUP_FILE_BYTES = 4096  # a cpuset list; bounded as every sysfs read is
FIXES = {
    "guaranteed": "exclusive CPUs on the device's node: the static CPU manager with the "
    "Topology Manager's single-numa-node policy (integer CPU requests = limits)",
    "burstable": "a cpuset of the device's CPUs (taskset -c DEVICE_CPUS, or a cpuset the "
    "runtime sets), or the opt-in scheduler (placement.scheduler: true)",
}
FIXES["besteffort"] = FIXES["burstable"]
ALREADY = "none needed: its remote share is low"


@dataclass(frozen=True)
class Row:
    namespace: str
    pod: str
    pod_uid: str
    device: str
    numa_node: int | None  # the device's, as kubenpu_device_info says it
    calls: float  # in the window (or since the agent started)
    remote: float
    device_cpus: str  # sysfs local_cpulist; "" unknown
    pod_cpus: str  # cpuset.cpus.effective of the pod's cgroup; "" unknown
    qos: str  # "" unknown

    @property
    def share(self) -> float:
        return self.remote / self.calls if self.calls else 0.0

    @property
    def fix(self) -> str:
        if self.share <= MOSTLY:
            return ALREADY
        return FIXES.get(self.qos, FIXES["burstable"]).replace("DEVICE_CPUS", self.device_cpus)

    def as_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "device": self.device,
            "numa_node": self.numa_node,
            "calls": self.calls,
            "remote_calls": self.remote,
            "remote_percent": round(100 * self.share, 3),
            "device_cpus": self.device_cpus,
            "pod_cpus": self.pod_cpus,
            "qos": self.qos,
            "fix": self.fix,
        }


def read(url: str, root: Path, window: float, timeout: float = 5.0) -> list[Row]:
    """Every pod and device with remote calls counted (devices with a NUMA node), over `window`
    seconds between two scrapes (0: the totals since the agent started). TopError when the
    agent cannot be read."""
    before, _ = scrape(url, timeout)
    if window:
        time.sleep(window)
        after, _ = scrape(url, timeout)
        calls, remote = _delta(_sums(before), _sums(after))
    else:
        calls, remote = _sums(before)
        after = before
    nodes = {
        s.labels.get("device", ""): s.labels.get("numa_node", "")
        for s in after
        if s.name == DEVICE_INFO
    }
    pods = _PodCgroups(root)
    rows = []
    for (namespace, pod, uid, device), n in sorted(remote.items()):
        cgroup = pods.find(uid)
        rows.append(
            Row(
                namespace,
                pod,
                uid,
                device,
                int(node) if (node := nodes.get(device, "")).isdigit() else None,
                calls.get((namespace, pod, uid, device), 0.0),
                n,
                _read(root / "sys/bus/pci/devices" / device / "local_cpulist"),
                _read(cgroup / "cpuset.cpus.effective") if cgroup else "",
                qos(cgroup, pods.base) if cgroup else "",
            )
        )
    return sorted(rows, key=lambda r: (-r.share, r.namespace, r.pod, r.device))


_Key = tuple[str, str, str, str]  # namespace, pod, pod_uid, device


def _sums(series: list[Series]) -> tuple[dict[_Key, float], dict[_Key, float]]:
    """Per pod and device (containers and kinds summed): the calls, and the remote ones."""
    calls: dict[_Key, float] = {}
    remote: dict[_Key, float] = {}
    for s in series:
        into = calls if s.name == IOCTL else remote if s.name == REMOTE else None
        if into is None or not s.labels.get("pod"):
            continue
        key = (
            s.labels["namespace"],
            s.labels["pod"],
            s.labels.get("pod_uid", ""),
            s.labels["device"],
        )
        into[key] = into.get(key, 0.0) + s.value
    return calls, remote


def _delta(
    before: tuple[dict[_Key, float], dict[_Key, float]],
    after: tuple[dict[_Key, float], dict[_Key, float]],
) -> tuple[dict[_Key, float], dict[_Key, float]]:
    """Each sum's increase; a sum that fell (an agent restart, a series retired) counts from 0."""
    return tuple(  # type: ignore[return-value]
        {k: v - old.get(k, 0.0) if v >= old.get(k, 0.0) else v for k, v in new.items()}
        for old, new in zip(before, after, strict=True)
    )


def _read(path: Path) -> str:
    try:
        return files.read_regular(path, _CGROUP_FILE_BYTES).decode(errors="replace").strip()
    except (OSError, ValueError):
        return ""


class _PodCgroups:
    """The pods' cgroup directories under the kubelet's kubepods tree (systemd or cgroupfs
    driver), by the pod uid the resolver reads in their path (resolve.containers)."""

    def __init__(self, root: Path) -> None:
        cgroupfs = root / "sys/fs/cgroup"
        self.base = next(
            (
                cgroupfs / name
                for name in ("kubepods.slice", "kubepods")
                if (cgroupfs / name).is_dir()
            ),
            cgroupfs,
        )
        self._dirs: dict[str, Path] | None = None

    def find(self, uid: str) -> Path | None:
        if self._dirs is None:
            self._dirs = {}
            if self.base.is_dir():
                for qos_dir in (self.base, *(p for p in self.base.iterdir() if p.is_dir())):
                    for pod in (p for p in qos_dir.iterdir() if p.is_dir()):
                        found = containers.parse(str(pod.relative_to(self.base.parent)))
                        if found is not None and found.container_id is None:
                            self._dirs[found.pod_uid] = pod
        return self._dirs.get(uid) if uid else None


def qos(cgroup: Path, base: Path) -> str:
    """The pod's QoS class from where the kubelet put its cgroup: under besteffort or burstable,
    else (directly under kubepods) guaranteed."""
    parent = cgroup.parent.name
    for name in ("besteffort", "burstable"):
        if parent in (name, f"kubepods-{name}.slice"):
            return name
    return "guaranteed" if cgroup.parent == base else ""
