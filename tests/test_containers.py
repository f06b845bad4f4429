import pytest

from kubenpu.resolve.containers import PodCgroup, parse

CID = "3f1a9c0d2b7e4f6a8c1d0e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"
UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
UID_ = UID.replace("-", "_")
STATIC_UID = "4bd4a6ac8cb9c2e0e1d0b2e8a3f0f0a3"  # static pods: a config hash, no dashes

BURSTABLE = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
BESTEFFORT = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
GUARANTEED = f"kubepods.slice/kubepods-pod{UID_}.slice"
KIND = (
    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{UID_}.slice"
)

IN_CONTAINER = PodCgroup(UID, CID)
POD_ONLY = PodCgroup(UID, None)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # systemd driver, each runtime and QoS class
        (f"/{BURSTABLE}/cri-containerd-{CID}.scope", IN_CONTAINER),
        (f"{BURSTABLE}/cri-containerd-{CID}.scope", IN_CONTAINER),
        (f"{BESTEFFORT}/crio-{CID}.scope", IN_CONTAINER),
        (f"{GUARANTEED}/docker-{CID}.scope", IN_CONTAINER),
        (f"{GUARANTEED}/cri-containerd-{CID}.scope", IN_CONTAINER),
        # sub-cgroups a container makes for itself (crun's "container", systemd in a container)
        (f"{BESTEFFORT}/crio-{CID}.scope/container", IN_CONTAINER),
        (f"{BURSTABLE}/cri-containerd-{CID}.scope/init.scope/x", IN_CONTAINER),
        # prefixes: kind (cgroupRoot /kubelet), a nested cgroup namespace
        (f"{KIND}/cri-containerd-{CID}.scope", IN_CONTAINER),
        (f"/k3s/{BURSTABLE}/cri-containerd-{CID}.scope", IN_CONTAINER),
        # containerd's own systemd cgroup form
        (
            f"system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}",
            IN_CONTAINER,
        ),
        (f"kubepods-pod{UID_}.slice:crio:{CID}", IN_CONTAINER),
        # cgroupfs driver
        (f"kubepods/burstable/pod{UID}/{CID}", IN_CONTAINER),
        (f"/kubepods/besteffort/pod{UID}/{CID}", IN_CONTAINER),
        (f"kubepods/pod{UID}/{CID}", IN_CONTAINER),
        (f"kubepods/besteffort/pod{UID}/crio-{CID}", IN_CONTAINER),
        (f"kubelet/kubepods/burstable/pod{UID}/{CID}", IN_CONTAINER),
        # static pod uid
        (
            f"kubepods.slice/kubepods-pod{STATIC_UID}.slice/cri-containerd-{CID}.scope",
            PodCgroup(STATIC_UID, CID),
        ),
        (f"kubepods/pod{STATIC_UID}/{CID}", PodCgroup(STATIC_UID, CID)),
        # pod-level cgroups: in a pod, but in no container
        (BURSTABLE, POD_ONLY),
        (f"kubepods/burstable/pod{UID}", POD_ONLY),
        (f"{BESTEFFORT}/crio-conmon-{CID}.scope", POD_ONLY),
        (f"{BURSTABLE}/cri-containerd-{CID[:12]}.scope", POD_ONLY),
        (f"kubepods/pod{UID}/{CID.upper()}", POD_ONLY),
    ],
)
def test_pod_paths(path: str, expected: PodCgroup) -> None:
    assert parse(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "init.scope",
        "system.slice/containerd.service",
        "system.slice/kubelet.service",
        "user.slice/user-1000.slice/session-3.scope",
        f"system.slice/docker-{CID}.scope",  # a docker container kubelet did not start
        "kubepods.slice",
        "kubepods.slice/kubepods-burstable.slice",
        "kubepods/burstable",
        # garbage
        f"pod{UID}/{CID}",  # no kubepods parent
        f"other/burstable/pod{UID}/{CID}",
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podXYZ.slice/cri-containerd-{CID}.scope",
        f"kubepods.slice/kubepods-pod{UID_}.scope/cri-containerd-{CID}.scope",
        "../../etc/passwd",
        "kubepods//pod/",
    ],
)
def test_not_pod_paths(path: str) -> None:
    assert parse(path) is None
