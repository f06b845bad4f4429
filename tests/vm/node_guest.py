"""Attribution against a real containerd, run as root inside the QEMU guest (see tests/vm/node.sh).

It starts containerd (Debian's, CRI plugin, runc, cgroupfs driver), imports two images built
here from local files (tests/vm/oci_image.py), and plays kubelet over the CRI gRPC API: pod
sandboxes with kubelet's labels and cgroup parent (/kubepods/besteffort/pod<uid>), host network,
the /dev/dri nodes passed in as CRI devices. The workloads are drmcall runs (in a container's
entrypoint or through ExecSync); their printed call counts are the expected values. The agent
asks containerd's own socket for every container's labels. Scenarios, in order:

  pod A (team-a/trainer-0), started before the agent: containers main and sidecar make calls on
      the same device and kind, told apart by the container label;
  main is restarted (kubelet: a new container, attempt 1, same labels): its counts add up;
  pod B (team-b/infer-0), started after the agent: calls from its first instant;
  a host process outside any pod: counted with empty labels, reason not_pod;
  pod B deleted: its series leave /metrics after metrics.series_ttl_seconds, A's stay.

fdinfo (issue 10): a container "gpu" in each pod holds DRM clients (drmcall --hold) of
tests/vm/kmod's test driver, whose fdinfo prints usage stats that follow its ioctls, and of vgem
and virtio-gpu (which print none). A's starts before the agent (found by its full scan at start),
B's after it, with one counted vgem call (found through the probe). With every call counted,
`kubenpuctl clients --output json` is recorded and the agent's busy-time, cycle, capacity and
memory series must equal what it lists; B's leave with its call counts. Without the test driver
(lockdown, or a kernel it is not built for) the holders hold vgem and virtio-gpu only.

Allocations (issue 21): tests/podresources_server.py plays the kubelet's PodResources API on its
real socket path, from before the agent starts. A's and B's gpu containers are allocated one
share each of the test driver (Intel GPU plugin ids cardN-0, cardN-1 of its card: a shared
device), pod C (team-c/idle-0) one virtio-gpu by its PCI address and never calls it (idle), plus
an id of no known format (unmapped). A's sidecar and B's server call virtio-gpu unallocated.

Device telemetry and energy per pod (issue 22): the test driver's hwmon (power1_input 25 W,
power1_cap set to 10 kW, temp1_input 45 °C; energy1_input +2 J per SUBMIT) on /metrics and over OTLP
(a receiver in the guest). Then container "energy" in pods A and B opens a client each, waits
(drmcall --wait-signal), and both make 36,000 and 12,000 SUBMITs at one signal, sent just after
an fdinfo read: the next read's energy increase, 96,000 J, must split 72,000 / 24,000 exactly,
with no idle share (60 s of busy time in a 10 s interval) and nothing unattributed.

Writes /out/result.json; tests/test_node_vm.py asserts on it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the OTLP receiver

import cri_test_pb2 as pb
import grpc
import oci_image
from google.protobuf.message import Message
from guestlib import (
    ATTACH_TIMEOUT,
    CGROUP,
    CREATE_DUMB,
    DRMCALL,
    OTLP,
    OTLP_PORT,
    PODRESOURCES,
    PROMETHEUS,
    RPC_TIMEOUT,
    SLOW,
    SYNCOBJ_WAIT,
    TESTDRM,
    TESTDRM_ALLOC,
    TESTDRM_JOB_10MS,
    TESTDRM_JOB_50MS,
    TESTDRM_JOB_HANG,
    TESTDRM_SUBMIT,
    VERSION,
    VGEM_FENCE_ATTACH,
    VIRTGPU_EXECBUFFER,
    VIRTGPU_RESOURCE_CREATE,
    VIRTGPU_WAIT,
    Agent,
    Call,
    Samples,
    client_series,
    device_node,
    drmcall_argv,
    ioctl_counts,
    load_testdrm,
    reports,
    run_scenario,
    same_usage,
    scrape,
    start_podresources,
    usage_series,
)
from least_privilege_guest import launcher, process_caps
from otlp_receiver import OtlpReceiver, attrs

from kubenpu.discovery import Device, discover
from kubenpu.resolve.cri import LABEL_CONTAINER, LABEL_NAMESPACE, LABEL_POD, LABEL_POD_UID

HERE = Path(__file__).resolve().parent
SOCKET = "/run/containerd/containerd.sock"  # also the agent's default CRI endpoint
PAUSE_IMAGE = "docker.io/kubenpu/pause:test"  # tests/vm/containerd/config.toml's sandbox_image
WORKLOAD_IMAGE = "docker.io/kubenpu/workload:test"
FOREVER = "2147483647"  # seconds, for busybox sleep
TTL = 10  # metrics.series_ttl_seconds: short, so the deleted pod retires within the run
# Any single wait in the guest (TCG on a shared host is slow); whole seconds, as ExecSyncRequest's
# timeout is an int64 (a float there ended both node boots under load).
STEP_TIMEOUT = math.ceil(120 * SLOW)
SETTLE_TIMEOUT = 60 * SLOW  # for /metrics to show what was issued
# kubelet's namespaces for a hostNetwork pod: no CNI needed.
HOST_NETWORK = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)
T = TypeVar("T")
M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    own_labels: tuple[tuple[str, str], ...] = ()  # the pod's, on its sandbox only (as kubelet)

    @property
    def cgroup_parent(self) -> str:
        return f"/kubepods/besteffort/pod{self.uid}"

    @property
    def log_directory(self) -> Path:
        return Path("/var/log/pods") / f"{self.namespace}_{self.name}_{self.uid}"

    def labels(self) -> dict[str, str]:
        return {LABEL_NAMESPACE: self.namespace, LABEL_POD: self.name, LABEL_POD_UID: self.uid}


POD_A = Pod("team-a", "trainer-0", "0b8f1a52-6c5e-4d0e-9a11-3f5a0c2b7e01")
POD_B = Pod("team-b", "infer-0", "5c2d0e7a-1b3f-4a66-8f0e-2d9c4b1a6e02")
POD_C = Pod("team-c", "idle-0", "7a4e2c19-3d5b-4f08-b6a1-9c0d2e4f6a03")
# The access guard (docs/guard.md), per namespace so that the scenario's other pods run as
# before: team-c (C: allocated virtio-gpu) in enforce, team-a (A: allocated the shared card, not
# virtio-gpu) in audit. Pods N and L of team-c are allocated nothing; L carries the label of
# the allow rule, on its sandbox.
POD_N = Pod("team-c", "nothing-0", "9e1f3a5b-7c2d-4e6f-8a0b-1c2d3e4f5a06")
DEBUG_LABEL = ("kubenpu.io/gpu-debug", "true")
POD_L = Pod("team-c", "debug-0", "4d3c2b1a-8f7e-4d6c-9b5a-0f1e2d3c4b07", (DEBUG_LABEL,))
GUARD = {
    "mode": "off",
    "namespaces": {POD_C.namespace: "enforce", POD_A.namespace: "audit"},
    "allow": [{"labels": dict([DEBUG_LABEL])}],
    "refresh_seconds": 2,
    "heartbeat_seconds": 0.5,
    "fail_open_seconds": 30,
}

# GPU jobs on the test driver's scheduler ring (one job at a time): A's 20 jobs of 50 ms are
# queued, then B's 10 of 10 ms behind them, while the ring holds A's first; then C's job hangs.
JOB_A = Pod("team-d", "batch-0", "3e9b7c21-4a6d-4f1e-8b2c-5d7e9f0a1b04")
JOB_B = Pod("team-e", "serve-0", "8c1d2e3f-5a6b-4c7d-9e0f-1a2b3c4d5e05")
JOB_C = Pod("team-f", "hang-0", "1f2e3d4c-6b5a-4978-8a6b-5c4d3e2f1a06")
JOB_D = Pod("team-g", "victim-0", "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c07")  # queued behind C's
JOB_PLANS = {JOB_A: (TESTDRM_JOB_50MS, 20), JOB_B: (TESTDRM_JOB_10MS, 10)}

ALLOCATIONS_INTERVAL = 2  # attribution.pod_resources.interval_seconds: short for the run
INTEL_GPU = "gpu.intel.com/i915"  # ids cardN-<share> (Intel's GPU plugin)
TEST_GPU = "kubenpu.test/gpu"  # a plugin of no known format: its ids are PCI addresses
UNMAPPED_ID = "slot-7"

FDINFO_INTERVAL = 10  # fdinfo.interval_seconds (telemetry and the energy split read with it)
ENERGY_SUBMITS = {POD_A: 36_000, POD_B: 12_000}  # 1.25 ms busy each: 45 s and 15 s
TESTDRM_PARAMS = Path("/sys/module/kubenpu_testdrm/parameters")
UJ_PER_SUBMIT = 2_000_000  # the test driver's ENERGY_UJ_PER_SUBMIT
# The energy run's 96,000 J in one 10 s interval is 9.6 kW: the agent takes a counter step as
# real up to twice the device's highest power limit (docs/metrics.md#the-energy-counter-rule).
POWER_CAP_UW = 10_000_000_000
DEVICE_ENERGY = "kubenpu_device_energy_joules_total"


@dataclass(frozen=True)
class Step:
    """One drmcall step: `count` DRM_IOWR(nr, size) calls on the device's first `node` node."""

    vendor: str
    node: str  # "card" or "renderD"
    ioctl: tuple[int, int]
    kind: str
    count: int


def vgem(ioctl: tuple[int, int], kind: str, count: int) -> Step:
    return Step("vgem", "card", ioctl, kind, count)


def virtio(ioctl: tuple[int, int], kind: str, count: int) -> Step:
    return Step("virtio_gpu", "renderD", ioctl, kind, count)


# Different counts everywhere, so a call counted under the wrong labels cannot go unnoticed.
MAIN_0 = [vgem(CREATE_DUMB, "alloc", 5), vgem(VGEM_FENCE_ATTACH, "submit", 3)]
MAIN_1 = [vgem(CREATE_DUMB, "alloc", 11), vgem(VGEM_FENCE_ATTACH, "submit", 13)]
SIDECAR = [
    vgem(CREATE_DUMB, "alloc", 7),
    virtio(VIRTGPU_EXECBUFFER, "submit", 6),
    virtio(VIRTGPU_WAIT, "wait", 4),
]
SERVER = [
    virtio(VIRTGPU_RESOURCE_CREATE, "alloc", 8),
    virtio(VIRTGPU_EXECBUFFER, "submit", 9),
    vgem(SYNCOBJ_WAIT, "wait", 3),
]
HOST = [vgem(CREATE_DUMB, "alloc", 4)]
# The gpu holders: test-driver (SUBMIT, ALLOC) calls, which the probe does not count, per pod.
HOLD_A = (7, 3)
HOLD_B = (4, 5)
GPU_B = [vgem(CREATE_DUMB, "alloc", 2)]  # B's holder, counted: the probe names its process
# The energy holders' counted calls, before and after their SUBMITs: of two kinds, so that each
# is a first sighting (aggregate mode reports the process of a key's first call only).
ENERGY_COUNTED = ([vgem(CREATE_DUMB, "alloc", 1)], [vgem(VGEM_FENCE_ATTACH, "submit", 1)])


def wait_for(what: str, check: Callable[[], T], timeout: float = STEP_TIMEOUT) -> T:
    """Poll `check()` until it returns something truthy; fail the run after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)
    return result


def _jobs_done(prom: Samples) -> dict[tuple[str, str], float]:
    return {
        (s["labels"]["namespace"], s["labels"]["pod"]): s["value"]
        for s in prom.get("kubenpu_jobs_total", [])
        if s["labels"]["device"] == TESTDRM
    }


def _pod_resets(prom: Samples, metric: str) -> dict[str, float]:
    """Per pod; the wedge run's resets name this guest's own process, no pod's."""
    return {
        s["labels"]["pod"]: s["value"]
        for s in prom.get(metric, [])
        if s["labels"]["device"] == TESTDRM and s["labels"]["pod"]
    }


def _resets(prom: Samples) -> float:
    return sum(
        s["value"]
        for s in prom.get("kubenpu_device_resets_total", [])
        if s["labels"]["device"] == TESTDRM and s["labels"]["method"] == "none"
    )


TESTDRM_STAMPS = Path("/sys/kernel/debug/testdrm-jobs")


def _by_pod(prom: Samples, name: str, *extra: str) -> dict[str, float]:
    """One metric's testdrm samples summed per "pod[/extra label values]"."""
    found: dict[str, float] = {}
    for s in prom.get(name, []):
        labels = s["labels"]
        if labels["device"] == TESTDRM:
            key = "/".join([labels["pod"], *(labels[e] for e in extra)])
            found[key] = found.get(key, 0.0) + s["value"]
    return found


def _contention(prom: Samples) -> dict[str, dict[str, float]]:
    """The blocked-by seconds per pod pair, the idle seconds and the queue wait per pod."""
    return {
        "behind": _by_pod(prom, "kubenpu_job_wait_behind_seconds_total", "behind_pod"),
        "idle": _by_pod(prom, "kubenpu_job_wait_idle_seconds_total"),
        "wait": _by_pod(prom, "kubenpu_job_wait_duration_seconds_sum"),
    }


def _cpu(prom: Samples) -> float:
    return sum(s["value"] for s in prom.get("process_cpu_seconds_total", []))


def _conserved(found: dict[str, dict[str, float]], pods: int) -> bool:
    """Every pod's behind + idle seconds reached its queue wait (once the agent replayed every
    job step: it holds back the last 0.1 s); the test checks the difference."""
    accrued = dict(found["idle"])
    for key, seconds in found["behind"].items():
        pod = key.split("/")[0]
        accrued[pod] = accrued.get(pod, 0.0) + seconds
    wait = found["wait"]
    return len(wait) == pods and all(abs(accrued.get(p, 0.0) - w) < 1e-6 for p, w in wait.items())


def _pushed_jobs(receiver: OtlpReceiver, pods: int) -> dict[str, list[dict]] | None:
    """The job histograms of the last push, once it has every pod's."""
    found: dict[str, list[dict]] = {}
    for _, m in receiver.metrics() if receiver.requests else ():
        if m.name in ("kubenpu.job.wait.duration", "kubenpu.job.run.duration"):
            found[m.name] = [
                {
                    "attributes": attrs(p.attributes),
                    "count": p.count,
                    "offset": p.positive.offset,
                    "buckets": list(p.positive.bucket_counts),
                    "zero": p.zero_count,
                }
                for p in m.exponential_histogram.data_points
            ]
    full = len(found) == 2 and all(len(points) >= pods for points in found.values())
    return found if full else None


def scrape_until(what: str, ok: Callable[[Samples], bool]) -> Samples:
    """The first scrape that `ok` accepts; fails the run after SETTLE_TIMEOUT seconds, the
    last scrape left in /out/last-scrape.prom to say what was missing."""

    def check() -> Samples | None:
        prom = scrape(Path("/out/last-scrape.prom"))  # retries a failed request itself
        return prom if ok(prom) else None

    return wait_for(what, check, timeout=SETTLE_TIMEOUT)


class Kubelet:
    """The CRI calls kubelet makes for hostNetwork pods under the cgroupfs driver."""

    def __init__(self, devices: list[str]) -> None:
        self._channel = grpc.insecure_channel(f"unix://{SOCKET}")
        self._devices = devices
        self.sandboxes: dict[Pod, tuple[str, pb.PodSandboxConfig]] = {}

    def call(
        self,
        method: str,
        request: Message,
        reply: type[M],
        service: str = "RuntimeService",
        timeout: float = STEP_TIMEOUT,
    ) -> M:
        rpc = self._channel.unary_unary(
            f"/runtime.v1.{service}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply.FromString,
        )
        return rpc(request, timeout=timeout)

    def pull(self, image: str) -> str:
        """kubelet's pull of a container's image (imagePullPolicy: the image is not on the node);
        the runtime's reference to what it pulled."""
        request = pb.PullImageRequest(image=pb.ImageSpec(image=image))
        # The agent's image is ~200 MB to fetch and unpack under TCG: longer than any other step.
        reply = self.call(
            "PullImage", request, pb.PullImageResponse, "ImageService", timeout=5 * STEP_TIMEOUT
        )
        return reply.image_ref

    def version(self) -> pb.VersionResponse:
        return self.call("Version", pb.VersionRequest(version="v1"), pb.VersionResponse)

    def run_pod(self, pod: Pod, namespaces: pb.NamespaceOption = HOST_NETWORK) -> str:
        # No hostname: kubelet sets none for hostNetwork pods (runc refuses one without a UTS
        # namespace of its own).
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace),
            log_directory=str(pod.log_directory),
            labels={**dict(pod.own_labels), **pod.labels()},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=pod.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=namespaces),
            ),
        )
        reply = self.call(
            "RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse
        )
        self.sandboxes[pod] = (reply.pod_sandbox_id, config)
        return reply.pod_sandbox_id

    def start_container(self, pod: Pod, name: str, attempt: int, command: list[str]) -> str:
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=WORKLOAD_IMAGE),
            command=command,
            devices=[
                pb.Device(container_path=p, host_path=p, permissions="rw") for p in self._devices
            ],
            labels={**pod.labels(), LABEL_CONTAINER: name},
            log_path=f"{name}/{attempt}.log",
            linux=pb.LinuxContainerConfig(
                security_context=pb.LinuxContainerSecurityContext(namespace_options=HOST_NETWORK)
            ),
        )
        return self.run_container(pod, config)

    def run_container(self, pod: Pod, config: pb.ContainerConfig) -> str:
        """CreateContainer and StartContainer in the pod's sandbox; returns the container id."""
        sandbox_id, sandbox_config = self.sandboxes[pod]
        (pod.log_directory / config.metadata.name).mkdir(parents=True, exist_ok=True)  # kubelet
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
        )
        container_id = self.call(
            "CreateContainer", request, pb.CreateContainerResponse
        ).container_id
        self.call(
            "StartContainer",
            pb.StartContainerRequest(container_id=container_id),
            pb.StartContainerResponse,
        )
        return container_id

    def exec(self, container_id: str, argv: list[str]) -> str:
        request = pb.ExecSyncRequest(container_id=container_id, cmd=argv, timeout=STEP_TIMEOUT)
        reply = self.call("ExecSync", request, pb.ExecSyncResponse)
        if reply.exit_code:
            raise SystemExit(f"exec {argv} exited {reply.exit_code}: {reply.stderr.decode()}")
        return reply.stdout.decode()

    def stop_container(self, container_id: str) -> None:
        # timeout 0: SIGKILL at once (sleep as PID 1 of its namespace ignores SIGTERM).
        request = pb.StopContainerRequest(container_id=container_id, timeout=0)
        self.call("StopContainer", request, pb.StopContainerResponse)

    def delete_pod(self, pod: Pod, container_ids: list[str]) -> None:
        """kubelet's order: stop the containers, stop the sandbox, then garbage-collect all."""
        sandbox_id, _ = self.sandboxes.pop(pod)
        for container_id in container_ids:
            self.stop_container(container_id)
        self.call(
            "StopPodSandbox",
            pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            pb.StopPodSandboxResponse,
        )
        for container_id in container_ids:
            self.call(
                "RemoveContainer",
                pb.RemoveContainerRequest(container_id=container_id),
                pb.RemoveContainerResponse,
            )
        self.call(
            "RemovePodSandbox",
            pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            pb.RemovePodSandboxResponse,
        )

    def status(self, container_id: str) -> dict:
        """What containerd says about a running container: the CRI fields the agent reads, and
        from the verbose info the pid and the cgroup path it put in the OCI spec."""
        request = pb.ContainerStatusRequest(container_id=container_id, verbose=True)
        reply = self.call("ContainerStatus", request, pb.ContainerStatusResponse)
        info = json.loads(reply.info["info"])
        pid = info["pid"]
        return {
            "id": reply.status.id,
            "name": reply.status.metadata.name,
            "attempt": reply.status.metadata.attempt,
            "state": pb.ContainerState.Name(reply.status.state),
            "labels": dict(reply.status.labels),
            "image": reply.status.image.image,
            "log_path": reply.status.log_path,
            "pid": pid,
            "spec_cgroups_path": info["runtimeSpec"]["linux"]["cgroupsPath"],
            "proc_cgroup": Path(f"/proc/{pid}/cgroup").read_text().strip(),
            "info_keys": sorted(info),
        }


def container_key(pod: Pod | None, name: str, attempt: int) -> str:
    """namespace/pod/container#attempt, the key of result.json's containers and issued."""
    return f"{pod.namespace}/{pod.name}/{name}#{attempt}" if pod else f"host/{name}"


def container_log(pod: Pod, name: str, attempt: int, lines: int) -> str:
    """stdout of a container from its CRI log (`<time> stdout F <line>`), once it has `lines`."""
    path = pod.log_directory / name / f"{attempt}.log"

    def read() -> str:
        if not path.exists():
            return ""
        out = [rec.split(" ", 3)[3] for rec in path.read_text().splitlines() if " stdout " in rec]
        return "\n".join(out) if len(out) >= lines else ""

    try:
        return wait_for(f"{lines} lines in {path}", read)
    except SystemExit as e:  # say what the container did say (stderr too)
        said = path.read_text()[-2000:] if path.exists() else "(no log)"
        raise SystemExit(f"{e}; the log has:\n{said}") from None


class Node:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.timings: dict[str, float] = {}
        self.expected: Counter[tuple[str, ...]] = Counter()
        self.unattributed: Counter[str] = Counter()
        self.issued: dict[str, Counter[tuple[str, str, str]]] = {}  # per container attempt
        self.containers: dict[str, dict] = {}
        self.testdrm_skipped = load_testdrm()  # before discovery and the agent's start
        if not self.testdrm_skipped:
            (TESTDRM_PARAMS / "power_cap_uw").write_text(f"{POWER_CAP_UW}\n")
        found = discover("/")
        self.devices: dict[str, Device] = {d.vendor: d for d in found if d.vendor}
        self.testdrm = next((d for d in found if d.id == TESTDRM), None)
        if self.testdrm is None and not self.testdrm_skipped:
            raise SystemExit("kubenpu_testdrm loaded, but discovery lists no device of it")
        gpus = [self.devices["vgem"], self.devices["virtio_gpu"], *filter(None, [self.testdrm])]
        self.kubelet = Kubelet([n.path for d in gpus for n in d.nodes])
        self._started = time.monotonic()

    def mark(self, phase: str) -> None:
        self.timings[phase] = round(time.monotonic() - self._started, 1)
        print(f"node: {phase} at {self.timings[phase]}s", flush=True)

    # --- workloads ---------------------------------------------------------------------------

    def calls(self, steps: list[Step]) -> list[Call]:
        nodes = [device_node(self.devices[s.vendor], s.node) for s in steps]
        return [Call.drm(node, s.ioctl, s.count) for node, s in zip(nodes, steps, strict=True)]

    def tally(self, pod: Pod | None, name: str, attempt: int, steps: list[Step], out: str) -> None:
        """Expected counts from drmcall's own report of what it issued."""
        who = (pod.namespace, pod.name, name) if pod else ("", "", "")
        issued = self.issued.setdefault(container_key(pod, name, attempt), Counter())
        for step, rep in zip(steps, reports(out, self.calls(steps)), strict=True):
            series = (self.devices[step.vendor].id, step.vendor, step.kind)
            issued[series] += rep["calls"]
            self.expected[(*who, *series)] += rep["calls"]
            if pod is None:
                self.unattributed["not_pod"] += rep["calls"]

    def entrypoint(self, steps: list[Step]) -> list[str]:
        """A container command that makes the calls at start, then stays up like a server."""
        script = f'"$0" "$@" && exec sleep {FOREVER}'  # $0: drmcall
        return ["/bin/sh", "-c", script, *drmcall_argv(self.calls(steps))]

    def run_entrypoint(self, pod: Pod, name: str, attempt: int, steps: list[Step]) -> str:
        cid = self.kubelet.start_container(pod, name, attempt, self.entrypoint(steps))
        self.tally(pod, name, attempt, steps, container_log(pod, name, attempt, len(steps)))
        self.record(pod, name, attempt, cid)
        return cid

    def run_exec(self, pod: Pod, name: str, cid: str, steps: list[Step]) -> None:
        """drmcall through ExecSync, in a container of attempt 0 started before the agent."""
        output = self.kubelet.exec(cid, drmcall_argv(self.calls(steps)))
        self.tally(pod, name, 0, steps, output)

    def run_host(self, steps: list[Step]) -> None:
        cgroup = CGROUP / "system.slice" / "host-tool.service"
        cgroup.mkdir(parents=True, exist_ok=True)
        argv = drmcall_argv(self.calls(steps), cgroup)
        output = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        self.tally(None, "host-tool", 0, steps, output)

    def run_holder(self, pod: Pod, counted: list[Step], submits: int, allocs: int) -> str:
        """Container "gpu": the counted steps, then uncounted calls that open a client of each
        device (test driver: `submits` SUBMIT and `allocs` ALLOC calls), all held open."""
        held = [
            Call.drm(device_node(self.devices["vgem"], "card"), VERSION, 1),
            Call.drm(device_node(self.devices["virtio_gpu"], "renderD"), VERSION, 1),
        ]
        if self.testdrm:
            node = device_node(self.testdrm, "renderD")
            held += [Call.drm(node, TESTDRM_SUBMIT, submits), Call.drm(node, TESTDRM_ALLOC, allocs)]
        calls = self.calls(counted)
        argv = drmcall_argv([*calls, *held])
        cid = self.kubelet.start_container(pod, "gpu", 0, [argv[0], "--hold", *argv[1:]])
        out = container_log(pod, "gpu", 0, len(calls) + len(held))
        reports(out, [*calls, *held])
        self.tally(pod, "gpu", 0, counted, "\n".join(out.splitlines()[: len(calls)]))
        self.record(pod, "gpu", 0, cid)
        return cid

    def pods_by_cgroup(self) -> dict[str, tuple[str, str, str]]:
        """namespace, pod and container of each recorded container's cgroup path."""
        return {
            c["proc_cgroup"].removeprefix("0::"): tuple(key.partition("#")[0].split("/"))
            for key, c in self.containers.items()
        }

    def settle_usage(self) -> tuple[list[dict], Samples]:
        """kubenpuctl's clients, and the first scrape whose fdinfo series equal what they say
        (or the last one before the deadline)."""
        ctl = ["kubenpuctl", "clients", "--output", "json"]
        clients = json.loads(subprocess.run(ctl, check=True, capture_output=True).stdout)
        want = client_series(clients, self.pods_by_cgroup())
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not same_usage(usage_series(prom := scrape()), want):
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        return clients, prom

    def record(self, pod: Pod, name: str, attempt: int, cid: str) -> None:
        status = self.kubelet.status(cid)
        status["pod_uid"] = pod.uid
        self.containers[container_key(pod, name, attempt)] = status

    # --- allocations: the kubelet's PodResources API, played ------------------------------------

    def allocation_state(self) -> dict:
        shared = Path(device_node(self.testdrm or self.devices["vgem"], "card")).name

        def pod(p: Pod, container: str, *devices: tuple[str, list[str]]) -> dict:
            held = [{"resource": r, "ids": ids} for r, ids in devices]
            return {
                "namespace": p.namespace,
                "name": p.name,
                "containers": [{"name": container, "devices": held}],
            }

        virtio = self.devices["virtio_gpu"].id
        return {
            "pods": [
                pod(POD_A, "gpu", (INTEL_GPU, [f"{shared}-0"])),
                pod(POD_B, "gpu", (INTEL_GPU, [f"{shared}-1"])),
                pod(POD_C, "idle", (TEST_GPU, [virtio, UNMAPPED_ID])),
            ],
            "allocatable": [{"resource": INTEL_GPU, "ids": [f"{shared}-0", f"{shared}-1"]}],
        }

    def settle_allocations(self, want: dict[tuple[str, ...], int]) -> Samples:
        """The first scrape whose unallocated-call counts equal `want` (the calls are added at
        an allocations refresh), or the last one before the deadline."""
        name = "kubenpu_device_unallocated_calls_total"
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            prom = scrape()
            got = {
                tuple(s["labels"][k] for k in ("namespace", "pod", "container", "device")): s[
                    "value"
                ]
                for s in prom.get(name, [])
            }
            if got == want or time.monotonic() > deadline:
                return prom
            time.sleep(1)

    def unallocated_expected(self) -> dict[tuple[str, ...], int]:
        """Submit calls on virtio-gpu (allocated to C only) by pods' containers that hold none
        of it (a host process's calls name no pod: not unallocated use)."""
        virtio = self.devices["virtio_gpu"].id
        return {
            (*key[:3], virtio): n
            for key, n in self.expected.items()
            if key[1] and key[3] == virtio and key[5] == "submit"
        }

    # --- device telemetry and energy per pod (the test driver's hwmon) -------------------------

    def start_waiting(self, pod: Pod) -> str:
        """Container "energy": a counted vgem call (the probe names its process), then it waits
        for SIGUSR1, opens the test driver, submits ENERGY_SUBMITS[pod] times, and makes one
        more counted call: the test driver's calls are not counted, and the probe's sighting of
        a process is what has fdinfo read it again (its first client had no stats)."""
        assert self.testdrm
        first, last = (self.calls(steps)[0] for steps in ENERGY_COUNTED)
        submit = Call.drm(device_node(self.testdrm, "renderD"), TESTDRM_SUBMIT, ENERGY_SUBMITS[pod])
        argv = drmcall_argv([first])
        argv = [argv[0], "--hold", *argv[1:], "--wait-signal", *drmcall_argv([submit, last])[1:]]
        cid = self.kubelet.start_container(pod, "energy", 0, argv)
        out = container_log(pod, "energy", 0, 2)  # the counted step, then {"waiting": true}
        self.tally(pod, "energy", 0, ENERGY_COUNTED[0], out.splitlines()[0])
        self.record(pod, "energy", 0, cid)
        return cid

    @staticmethod
    def device_energy(prom: Samples) -> float | None:
        found = [
            s["value"] for s in prom.get(DEVICE_ENERGY, []) if s["labels"]["device"] == TESTDRM
        ]
        return found[0] if found else None

    def after_a_read(self) -> Samples:
        """A scrape taken just after an fdinfo read: 1 µJ more on the counter shows when."""
        before = self.device_energy(scrape())
        base = int((TESTDRM_PARAMS / "energy_uj").read_text())
        (TESTDRM_PARAMS / "energy_uj").write_text(f"{base + 1}\n")
        return scrape_until(
            "an fdinfo read after the 1 µJ marker", lambda p: self.device_energy(p) != before
        )

    def run_energy(self) -> dict:
        """Both holders submit at one signal right after a read; the scrapes around the next."""
        cids = {pod: self.start_waiting(pod) for pod in ENERGY_SUBMITS}
        self.settle(dict(self.expected))  # both containers known: their pods resolved
        self.mark("energy holders waiting")
        before = self.after_a_read()
        signalled = time.monotonic()
        for cid in cids.values():
            os.kill(self.kubelet.status(cid)["pid"], signal.SIGUSR1)
        for pod in cids:
            last = container_log(pod, "energy", 0, 4).splitlines()[3]
            self.tally(pod, "energy", 0, ENERGY_COUNTED[1], last)
        submitted = time.monotonic() - signalled
        mid = scrape()  # no read may have come between the marker's and the submits' end
        rise = sum(ENERGY_SUBMITS.values()) * UJ_PER_SUBMIT / 1e6
        start = self.device_energy(before) or 0.0
        after = scrape_until(
            "the read after the submits", lambda p: (self.device_energy(p) or 0) >= start + rise
        )
        self.mark("energy split")
        return {
            "cids": {pod.name: cid for pod, cid in cids.items()},
            "submits": {pod.name: n for pod, n in ENERGY_SUBMITS.items()},
            "uj_per_submit": UJ_PER_SUBMIT,
            "submitted_seconds": round(submitted, 2),
            "read_between": self.device_energy(mid) != self.device_energy(before),
            "before": before,
            "after": after,
        }

    def run_wedge(self) -> dict:
        """The test driver sends the DRM wedged uevent of a hang that needs a rebind, then the
        one of a reset that recovered it (its `wedge` parameter; this process is the guilty
        task): the agent hears both on its netlink socket, in the real kernel's format."""

        def state(prom: Samples) -> dict[str, float]:
            return {
                s["labels"]["state"]: s["value"]
                for s in prom.get("kubenpu_device_status", [])
                if s["labels"]["device"] == TESTDRM
            }

        ok = state(scrape())
        (TESTDRM_PARAMS / "wedge").write_text("rebind\n")
        failed = state(scrape_until("the wedged device failed", lambda p: state(p)["failed"] == 1))
        (TESTDRM_PARAMS / "wedge").write_text("none\n")
        recovered = scrape_until("the device recovered", lambda p: state(p)["ok"] == 1)
        self.mark("wedged and recovered")
        task = Path("/proc/self/comm").read_text().strip()
        return {"ok": ok, "failed": failed, "recovered": recovered, "guilty": [os.getpid(), task]}

    def start_jobs(self, pod: Pod, ioctl: tuple[int, int], count: int, wait: bool) -> str:
        """Container "jobs": `count` test-driver jobs (after SIGUSR1 with `wait`), its fd held
        open until they are done (closing it would kill the queued ones)."""
        assert self.testdrm
        self.kubelet.run_pod(pod)
        argv = drmcall_argv([Call.drm(device_node(self.testdrm, "renderD"), ioctl, count)])
        flags = ["--hold", *(["--wait-signal"] if wait else [])]
        cid = self.kubelet.start_container(pod, "jobs", 0, [argv[0], *flags, *argv[1:]])
        container_log(pod, "jobs", 0, 1)  # {"waiting": true}, or the submits' report
        self.record(pod, "jobs", 0, cid)
        return cid

    def run_jobs(self, receiver: OtlpReceiver) -> dict:
        """A's jobs queued, then B's behind them, the ring holding A's first meanwhile; then a
        job that hangs, which the driver resets after its timeout."""
        cids = {pod: self.start_jobs(pod, *plan, wait=True) for pod, plan in JOB_PLANS.items()}
        (TESTDRM_PARAMS / "ring_paused").write_text("1\n")
        for pod, cid in cids.items():  # in order: each one's submits are done before the next's
            os.kill(self.kubelet.status(cid)["pid"], signal.SIGUSR1)
            container_log(pod, "jobs", 0, 2)
        (TESTDRM_PARAMS / "ring_paused").write_text("0\n")
        want = {(pod.namespace, pod.name): n for pod, (_, n) in JOB_PLANS.items()}
        done = scrape_until("every job done", lambda p: _jobs_done(p) == want)
        self.mark("jobs done")
        resets = _resets(done)
        # Both containers up first: a pod's start can take longer than the scheduler's timeout
        # under TCG, and D's jobs must be queued behind C's before it fires.
        hang = self.start_jobs(JOB_C, TESTDRM_JOB_HANG, 1, wait=True)
        victim = self.start_jobs(JOB_D, TESTDRM_JOB_50MS, 5, wait=True)
        for pod, cid in ((JOB_C, hang), (JOB_D, victim)):  # D's 5 in flight at the timeout
            os.kill(self.kubelet.status(cid)["pid"], signal.SIGUSR1)
            container_log(pod, "jobs", 0, 2)
        hung = scrape_until(
            "the hang's reset, its guilty pod and its victim counted, the victim's jobs done",
            lambda p: (
                _resets(p) > resets
                and _pod_resets(p, "kubenpu_pod_device_hangs_total") == {JOB_C.name: 1}
                and _pod_resets(p, "kubenpu_pod_device_reset_victim_total") == {JOB_D.name: 1}
                and _jobs_done(p).get((JOB_D.namespace, JOB_D.name)) == 5
            ),
        )
        self.mark("hung job reset")
        pid = self.kubelet.status(hang)["pid"]
        pushed = wait_for("the jobs pushed", lambda: _pushed_jobs(receiver, len(JOB_PLANS) + 1))
        pods = {**cids, JOB_C: hang, JOB_D: victim}
        settled = scrape_until(
            "the blocked-by seconds of every pod's queue wait",
            lambda p: _conserved(_contention(p), len(pods)),
        )
        self.mark("blocked-by settled")
        # the test driver's own per-job times, by the submitting process's pod
        tgids = {self.kubelet.status(cid)["pid"]: pod.name for pod, cid in pods.items()}
        stamps = [
            [tgids.get(int(f[0]), f[0]), *map(int, f[1:])]
            for f in (line.split() for line in TESTDRM_STAMPS.read_text().splitlines())
        ]
        return {
            "done": done,
            "hung": hung,
            "otlp": pushed,
            "hang_pid": pid,
            "contention": _contention(settled),
            "stamps": stamps,
            "cpu": [_cpu(done), _cpu(settled)],
        }

    @staticmethod
    def otlp_telemetry(receiver: OtlpReceiver) -> dict[str, list[dict]]:
        """The hw.* points of the last push."""
        found: dict[str, list[dict]] = {}
        for _, m in receiver.metrics():
            if m.name.startswith("hw."):
                points = getattr(m, m.WhichOneof("data")).data_points
                found[m.name] = [
                    {"attributes": attrs(p.attributes), "value": getattr(p, p.WhichOneof("value"))}
                    for p in points
                ]
        return found

    # --- containerd, images, agent -----------------------------------------------------------

    def start_containerd(self) -> subprocess.Popen:
        # overlayfs snapshots need an upper dir that is not itself on overlayfs (the guest root).
        Path("/var/lib/containerd").mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/var/lib/containerd"], check=True)
        log = open(self.out / "containerd.log", "w")  # noqa: SIM115 - lives as long as containerd
        proc = subprocess.Popen(
            ["containerd", "--config", str(HERE / "containerd/config.toml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"containerd exited {proc.returncode}; see containerd.log")
            try:
                return bool(self.kubelet.version().runtime_name)
            except grpc.RpcError:
                return False

        wait_for("containerd's CRI", ready)
        return proc

    def import_images(self) -> None:
        busybox = {"bin/busybox": Path("/usr/bin/busybox")}
        links = {f"bin/{tool}": "busybox" for tool in ("sh", "sleep", "cat")}
        images = {
            PAUSE_IMAGE: (busybox, ["/bin/sleep", FOREVER]),
            WORKLOAD_IMAGE: ({**busybox, DRMCALL.lstrip("/"): Path(DRMCALL)}, ["/bin/sh"]),
        }
        for name, (files, cmd) in images.items():
            archive = Path("/tmp") / (name.rpartition("/")[2].replace(":", "-") + ".tar")
            oci_image.write_archive(archive, name, files, links, cmd)
            ctr = ["ctr", "--address", SOCKET, "--namespace", "k8s.io", "images", "import"]
            subprocess.run([*ctr, str(archive)], check=True)

    def start_agent(self) -> Agent:
        # attribution.cri.endpoint: the default, containerd's.
        config = {
            "metrics": {"series_ttl_seconds": TTL},
            "export": {
                "prometheus": PROMETHEUS,
                "otlp": OTLP,
            },
            "fdinfo": {"interval_seconds": FDINFO_INTERVAL},
            "attribution": {
                # A loaded host slows the TCG guest past the 5 s default: a List that timed
                # out failed the run's "no kubelet error" (a cold CI on a busy machine).
                "cri": {"timeout_seconds": RPC_TIMEOUT},
                "pod_resources": {
                    "enabled": True,
                    "socket": str(PODRESOURCES),
                    "interval_seconds": ALLOCATIONS_INTERVAL,
                    "timeout_seconds": RPC_TIMEOUT,
                },
            },
            "guard": GUARD,
        }
        # Exactly the chart's capabilities (tests/test_node_vm.py writes them), as runc gives them.
        caps = json.loads((self.out / "caps.json").read_text())
        agent = Agent(self.out, config, launcher=launcher(caps))
        self.caps = process_caps(agent.pid)
        agent.attach(ATTACH_TIMEOUT)
        return agent

    # --- the access guard ----------------------------------------------------------------------

    def exec_status(self, cid: str, argv: list[str]) -> dict:
        request = pb.ExecSyncRequest(container_id=cid, cmd=argv, timeout=STEP_TIMEOUT)
        reply = self.kubelet.call("ExecSync", request, pb.ExecSyncResponse)
        return {"exit": reply.exit_code, "stderr": reply.stderr.decode()[-200:]}

    def run_guard(self, idle: str, sidecar: str) -> dict:
        """With the agent's guard (GUARD), last in the run (its calls are in no expected count):
        a new container of C (allocated virtio-gpu) opens it and calls at once at its start;
        pod N, allocated nothing, is denied once the policy names it, and pod L, allocated
        nothing but labelled as the allow rule asks, is allowed both devices; C is denied the
        card it was not allocated and allowed virtio-gpu; A (audit) is allowed virtio-gpu,
        counted."""
        virtio = device_node(self.devices["virtio_gpu"], "renderD")
        card = device_node(self.testdrm or self.devices["vgem"], "card")

        def one(node: str) -> list[str]:
            return drmcall_argv([Call.drm(node, VERSION, 1)])

        found: dict = {"virtio": self.devices["virtio_gpu"].id}
        found["card"] = (self.testdrm or self.devices["vgem"]).id
        script = f'"$0" "$@" && exec sleep {FOREVER}'
        starter = self.kubelet.start_container(
            POD_C, "starter", 0, ["/bin/sh", "-c", script, *one(virtio)]
        )
        found["c_at_start"] = reports(
            container_log(POD_C, "starter", 0, 1), [Call.drm(virtio, VERSION, 1)]
        )
        self.kubelet.run_pod(POD_N)
        nothing = self.kubelet.start_container(POD_N, "main", 0, ["/bin/sleep", FOREVER])
        self.kubelet.run_pod(POD_L)
        labelled = self.kubelet.start_container(POD_L, "main", 0, ["/bin/sleep", FOREVER])

        def named(prom: Samples) -> bool:
            policy = prom.get("kubenpu_device_access_policy", [])
            return {POD_N.name, POD_L.name} <= {s["labels"]["pod"] for s in policy}

        found["policy"] = scrape_until("pods N and L in the guard's policy", named)[
            "kubenpu_device_access_policy"
        ]
        found["n_virtio"] = self.exec_status(nothing, one(virtio))
        found["l_virtio"] = self.exec_status(labelled, one(virtio))
        found["l_card"] = self.exec_status(labelled, one(card))
        found["c_virtio"] = self.exec_status(idle, one(virtio))
        found["c_card"] = self.exec_status(idle, one(card))
        found["a_virtio"] = self.exec_status(sidecar, one(virtio))

        def counted(prom: Samples) -> bool:
            pods = {s["labels"]["pod"] for s in prom.get("kubenpu_device_access_denied_total", [])}
            return {POD_N.name, POD_C.name, POD_A.name} <= pods

        prom = scrape_until("the guard's denials", counted)
        found["denied"] = prom["kubenpu_device_access_denied_total"]
        found["unchecked"] = prom.get("kubenpu_device_access_unchecked_total", [])
        self.kubelet.delete_pod(POD_N, [nothing])
        self.kubelet.delete_pod(POD_L, [labelled])
        self.kubelet.stop_container(starter)
        return found

    # --- /metrics ----------------------------------------------------------------------------

    @staticmethod
    def settle(want: dict[tuple[str, ...], int]) -> Samples:
        """The first scrape that shows exactly `want`, or the last one before the deadline."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            prom = scrape()
            if ioctl_counts(prom) == want or time.monotonic() > deadline:
                return prom
            time.sleep(1)

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> dict:
        containerd = self.start_containerd()
        version = self.kubelet.version()
        self.mark("containerd ready")
        agent = None
        podresources = start_podresources(self.allocation_state(), self.out / "podresources.json")
        receiver = OtlpReceiver(port=OTLP_PORT)
        energy: dict = {}
        wedge: dict = {}
        jobs: dict = {}
        try:
            self.import_images()
            self.mark("images imported")
            self.kubelet.run_pod(POD_A)
            sleep = ["/bin/sleep", FOREVER]
            main0 = self.kubelet.start_container(POD_A, "main", 0, sleep)
            sidecar = self.kubelet.start_container(POD_A, "sidecar", 0, sleep)
            self.record(POD_A, "main", 0, main0)
            self.record(POD_A, "sidecar", 0, sidecar)
            self.run_holder(POD_A, [], *HOLD_A)
            self.kubelet.run_pod(POD_C)
            idle = self.kubelet.start_container(POD_C, "idle", 0, sleep)
            self.record(POD_C, "idle", 0, idle)
            self.mark("pods A and C running")
            agent = self.start_agent()
            self.mark("agent attached")
            self.run_exec(POD_A, "main", main0, MAIN_0)
            self.run_exec(POD_A, "sidecar", sidecar, SIDECAR)
            self.mark("pod A calls made")
            self.kubelet.run_pod(POD_B)
            server = self.run_entrypoint(POD_B, "server", 0, SERVER)
            gpu_b = self.run_holder(POD_B, GPU_B, *HOLD_B)
            self.mark("pod B ran")
            self.kubelet.stop_container(main0)  # kubelet restarts it as attempt 1
            self.run_entrypoint(POD_A, "main", 1, MAIN_1)
            self.mark("main restarted")
            self.run_host(HOST)
            expected_before = dict(self.expected)
            before = self.settle(expected_before)
            self.mark("counts settled")
            clients, usage = self.settle_usage()
            self.mark("fdinfo settled")
            allocations = self.settle_allocations(self.unallocated_expected())
            ctl_allocations = json.loads(
                subprocess.run(
                    ["kubenpuctl", "allocations", "--socket", str(PODRESOURCES), "-o", "json"],
                    check=True,
                    capture_output=True,
                ).stdout
            )
            self.mark("allocations settled")
            if self.testdrm:
                energy = self.run_energy()
                wedge = self.run_wedge()
                jobs = self.run_jobs(receiver)
            otlp = self.otlp_telemetry(receiver)
            pod_b = (POD_B.namespace, POD_B.name)
            energy_b = [energy["cids"][POD_B.name]] if energy else []
            self.kubelet.delete_pod(POD_B, [server, gpu_b, *energy_b])
            deleted = time.monotonic()
            self.mark("pod B deleted")
            after_expected = {k: v for k, v in self.expected.items() if k[:2] != pod_b}
            after = self.settle(after_expected)
            retired_after = time.monotonic() - deleted
            self.mark("pod B retired")
            guard = self.run_guard(idle, sidecar)
            self.mark("guard checked")
        finally:
            if agent:
                agent.stop()
            containerd.terminate()
            containerd.wait(timeout=30)
            podresources.terminate()
            podresources.wait(timeout=30)
            receiver.stop()
        return {
            "kernel": os.uname().release,
            "runtime": {
                "name": version.runtime_name,
                "version": version.runtime_version,
                "api": version.runtime_api_version,
            },
            "ttl_seconds": TTL,
            "timings": self.timings,
            "retired_after_seconds": round(retired_after, 1),
            "containers": self.containers,
            "expected_before": [
                {"labels": list(k), "value": v} for k, v in expected_before.items()
            ],
            "devices": {vendor: d.id for vendor, d in self.devices.items()},
            "expected_after": [{"labels": list(k), "value": v} for k, v in after_expected.items()],
            "expected_unattributed": dict(self.unattributed),
            "issued": {
                key: [{"labels": list(k), "value": v} for k, v in calls.items()]
                for key, calls in self.issued.items()
            },
            "before_delete": before,
            "after_delete": after,
            "testdrm_skipped": self.testdrm_skipped,
            "hold": {"team-a": HOLD_A, "team-b": HOLD_B},
            "clients": clients,
            "pods_by_cgroup": self.pods_by_cgroup(),
            "usage": usage,
            "allocation_state": self.allocation_state(),
            "allocations": allocations,
            "unallocated_expected": [
                {"labels": list(k), "value": v} for k, v in self.unallocated_expected().items()
            ],
            "ctl_allocations": ctl_allocations,
            "energy": energy,
            "wedge": wedge,
            "jobs": jobs,
            "otlp_telemetry": otlp,
            "agent_log": agent.log(),
            "caps": self.caps,
            "guard": guard,
        }


if __name__ == "__main__":
    sys.exit(run_scenario("node", lambda out: Node(out).run()))
