"""Container id and pod uid from a cgroup v2 path, for the layouts kubelet and runtimes create.

systemd driver:  [prefix/]kubepods.slice/kubepods-burstable.slice/
                 kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
                 (crio-<id>.scope, docker-<id>.scope; guaranteed pods directly under
                 kubepods.slice; kind nests a "kubelet-" prefix into every slice name)
cgroupfs driver: [prefix/]kubepods/burstable/pod<uid>/<id>   (or kubepods/pod<uid>/<id>)
containerd's own systemd form: [prefix/]kubepods-burstable-pod<uid>.slice:cri-containerd:<id>

Components below the container's cgroup (sub-cgroups a container made for itself) still belong
to that container.
"""

import re
from dataclasses import dataclass

_UID = r"(?P<uid>[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12}|[0-9a-f]{32})"
_QOS = r"(?:-(?:burstable|besteffort))?"
_ID = r"(?P<id>[0-9a-f]{64})"
_RUNTIME = r"(?:cri-containerd|crio|docker)"

_SYSTEMD_POD = re.compile(rf"(?:.+-)?kubepods{_QOS}-pod{_UID}\.slice")
_CGROUPFS_POD = re.compile(rf"pod{_UID}")
# The runtime prefix is optional: containerd and docker name the cgroup by the bare id under the
# cgroupfs driver. crio-conmon-<id>.scope (CRI-O's monitor process) does not match: not a container.
_CONTAINER = re.compile(rf"(?:{_RUNTIME}-)?{_ID}(?:\.scope)?")
_SYSTEMD_COLON = re.compile(rf"(?:.+-)?kubepods{_QOS}-pod{_UID}\.slice:{_RUNTIME}:{_ID}")


@dataclass(frozen=True)
class PodCgroup:
    pod_uid: str  # with dashes, as in the pod's metadata.uid
    container_id: str | None  # None for a pod-level cgroup (the pod slice, CRI-O's conmon)


def parse(path: str) -> PodCgroup | None:
    """The pod (and container) a cgroup path belongs to, or None for a non-pod cgroup."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if m := _SYSTEMD_COLON.fullmatch(part):
            return PodCgroup(_dashed(m["uid"]), m["id"])
        m = _SYSTEMD_POD.fullmatch(part) or (
            _under_kubepods(parts, i) and _CGROUPFS_POD.fullmatch(part)
        )
        if m:
            child = _CONTAINER.fullmatch(parts[i + 1]) if i + 1 < len(parts) else None
            return PodCgroup(_dashed(m["uid"]), child["id"] if child else None)
    return None


def _under_kubepods(parts: list[str], i: int) -> bool:
    """cgroupfs pod directories sit in kubepods/ or kubepods/<qos>/."""
    parent = parts[i - 1] if i >= 1 else ""
    return parent == "kubepods" or (
        i >= 2 and parts[i - 2] == "kubepods" and parent in ("burstable", "besteffort")
    )


def _dashed(uid: str) -> str:
    return uid.replace("_", "-")
