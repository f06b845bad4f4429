"""The end-to-end scenario, run as root inside the QEMU guest (see tests/vm/e2e.sh).

It plays kubelet and the container runtime: it makes kubelet-style cgroups (one systemd-style pod
before the agent starts, one cgroupfs-style pod after), answers CRI ContainerStatus from a real
gRPC server, runs workloads with known ioctl counts, and records what the agent exported on
/metrics and over OTLP next to what was issued. tests/test_e2e_vm.py asserts on the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers

from cri_server import CriTestServer
from guestlib import (
    CGROUP,
    CREATE_DUMB,
    GET_CAP,
    MODES,
    OTLP,
    OTLP_PORT,
    PODRESOURCES,
    PROMETHEUS,
    RPC_TIMEOUT,
    SLOW,
    SYNCOBJ_WAIT,
    TCGETS,
    TESTDRM,
    TESTDRM_ALLOC,
    TESTDRM_SUBMIT,
    VERSION,
    VGEM_FENCE_ATTACH,
    VGEM_FENCE_SIGNAL,
    VIRTGPU_EXECBUFFER,
    VIRTGPU_RESOURCE_CREATE,
    VIRTGPU_WAIT,
    Agent,
    Call,
    Returns,
    Samples,
    add_container,
    cgroupfs_cgroup,
    device_node,
    drmcall,
    drmcall_argv,
    ioctl_counts,
    kernel_durations,
    load_testdrm,
    scrape,
    start_podresources,
    systemd_cgroup,
)
from otlp_receiver import OtlpReceiver

from kubenpu.discovery import discover

SETTLE_TIMEOUT = 60 * SLOW
TIMED_COUNT = "kubenpu_ioctl_duration_seconds_count"  # the timed calls, per ioctl series
# With this kernel argument the first mode also records timestamped scrapes while pods make
# calls (RECORD_ROUNDS, RECORD_INTERVAL seconds apart) into OUT/MODE/recording.json, for the host
# to backfill into a real Prometheus and run every dashboard query on (tests/test_e2e_vm.py).
RECORD_ARG = "kubenpu.record_dashboards=1"
LOADER_ARG = "kubenpu.loader="  # + a probe.loader value: the boot's loader (default: the agent's)
RECORD_ROUNDS = 6
RECORD_INTERVAL = 5.0  # no shorter than the agent's read of the kernel's counts (aggregate: 5 s)
# Per recording round, a new process of the render pod holds a client of tests/vm/kmod's test
# driver with this many SUBMIT and ALLOC calls. Each also makes one counted vgem alloc, so the
# agent's fdinfo reader follows it (the first through the probe's report of its tgid, the later
# ones through their cgroup's calls): the dashboards' busy and memory panels get growing series.
RECORD_HOLD = (40, 2)
# While recording, a played kubelet's PodResources API allocates the test driver to the render
# pod (its node name in the id, found by the allocations mapper's fallback) and virtio-gpu, with an
# id that maps to nothing, to IDLE_POD, which never calls: the dashboards' allocation panels get an
# idle allocation, a used one, an unmapped id, and trainer-0's calls on virtio-gpu unallocated.
RECORD_RESOURCE = "kubenpu.test/gpu"  # a plugin of no known format
IDLE_POD = ("team-e", "idle-0", "main")  # a namespace no pod of which calls
ALLOCATIONS_INTERVAL = 2  # attribution.pod_resources.interval_seconds: well inside a round


def batch_pod(mode: str, i: int) -> dict:
    """A short-lived pod of recording round i: a new container each round keeps CRI lookups
    (the latency panel) and pod churn (the top-pods table) in the recorded window."""
    tag = f"c{MODES.index(mode)}{i:x}"
    return {
        "id": (tag * 22)[:64],
        "namespace": "team-c",
        "pod": f"batch-{i}",
        "container": "job",
        "pod_uid": f"9e1c7b30-4d2a-4f5e-8b6c-1a2b3c4d5e{MODES.index(mode)}{i:x}",
    }


def render_pod(mode: str) -> dict:
    """The recording's test-driver pod (systemd cgroup driver)."""
    n = MODES.index(mode)
    return {
        "id": f"d{n}" * 32,
        "namespace": "team-d",
        "pod": "render-0",
        "container": "gpu",
        "pod_uid": f"7f3e9a10-2c4b-4d8e-9f01-6a5b4c3d2e1{n}",
    }


def allocations(mode: str, testdrm_card: str | None, virtio: str) -> dict:
    """The played kubelet's answer (tests/podresources_server.py state): the test driver's card
    to the render pod, virtio-gpu and an id that maps to nothing to IDLE_POD."""
    render = render_pod(mode)

    def held(pod: tuple[str, str, str], ids: list[str]) -> dict:
        devices = [{"resource": RECORD_RESOURCE, "ids": ids}]
        return {
            "namespace": pod[0],
            "name": pod[1],
            "containers": [{"name": pod[2], "devices": devices}],
        }

    return {
        "pods": [
            held(
                (render["namespace"], render["pod"], render["container"]),
                [testdrm_card] if testdrm_card else [],
            ),
            held(IDLE_POD, [virtio, "slot-7"]),
        ]
    }


def pods(mode: str) -> tuple[dict, dict]:
    """Pod A (systemd cgroup driver, exists before the agent starts) and pod B (cgroupfs driver,
    created after the agent has started). Ids differ per mode: each mode runs its own agent."""
    n = MODES.index(mode)
    pod_a = {
        "id": f"a{n}" * 32,
        "namespace": "team-a",
        "pod": "trainer-0",
        "container": "main",
        "pod_uid": f"0b8f1a52-6c5e-4d0e-9a11-3f5a0c2b7e0{n}",
    }
    pod_b = {
        "id": f"b{n}" * 32,
        "namespace": "team-b",
        "pod": "infer-7d9f",
        "container": "server",
        "pod_uid": f"5c2d0e7a-1b3f-4a66-8f0e-2d9c4b1a6e0{n}",
    }
    return pod_a, pod_b


class Scenario:
    launcher: tuple[str, ...] = ()  # what the agent runs under (setpriv for least privilege)
    hook: str | None = None  # probe.hook; None: the agent's default
    jobs = True  # probe.jobs: the agent's default
    durations_exit = ""  # probe.durations_exit: "" = the agent's default
    loader = next(
        (
            a.removeprefix(LOADER_ARG)
            for a in Path("/proc/cmdline").read_text().split()
            if a.startswith(LOADER_ARG)
        ),
        None,
    )  # probe.loader; None: the agent's default

    def __init__(self, out: Path, mode: str) -> None:
        self.out = out
        self.mode = mode
        self.expected: Counter[tuple[str, ...]] = Counter()
        self.unattributed: Counter[str] = Counter()
        subprocess.run(["modprobe", "bochs"], check=True)  # idempotent
        # The recording's fdinfo source, loaded before the agent discovers devices.
        self.testdrm_skipped = load_testdrm() if self.records else "not recording"
        found = discover("/")
        self.returns = Returns(found)
        devices = {d.vendor: d for d in found if d.vendor}
        self.vgem, self.virtio = devices["vgem"], devices["virtio_gpu"]
        self.bochs = next(d for d in found if d.driver == "bochs-drm")
        self.testdrm = next((d for d in found if d.id == TESTDRM), None)

    def expect(self, pod: dict | None, device, kind: str, n: int) -> None:
        who = (pod["namespace"], pod["pod"], pod["container"]) if pod else ("", "", "")
        if n == 0:
            return
        if pod is None:
            self.unattributed["not_pod"] += n
        self.expected[(*who, device.id, device.vendor, kind)] += n

    def workload(self, pod: dict | None, cgroup: Path, vgem_scale: int, virtio_scale: int) -> None:
        vg, vr = device_node(self.vgem, "card"), device_node(self.virtio, "renderD")
        vc = device_node(self.virtio, "card")
        call = Call.drm
        plan = [
            call(vg, CREATE_DUMB, 5 * vgem_scale),
            call(vg, VGEM_FENCE_ATTACH, 3 * vgem_scale),
            call(vg, SYNCOBJ_WAIT, 2 * vgem_scale),
            call(vr, VIRTGPU_EXECBUFFER, 6 * virtio_scale),
            call(vr, VIRTGPU_RESOURCE_CREATE, 4 * virtio_scale),
            call(vr, VIRTGPU_WAIT, 7 * virtio_scale),
            call(vc, CREATE_DUMB, 1 * virtio_scale),
            # Calls that must not count: outside the tables, or not DRM ioctls at all.
            call(vg, VERSION, 4),
            call(vg, GET_CAP, 4),
            call(vg, VGEM_FENCE_SIGNAL, 4),
            call(vr, VERSION, 4),
            Call(vr, TCGETS, 64, 4, raw=True),
        ]
        self.returns.add(cgroup, plan, drmcall(plan, cgroup))
        self.expect(pod, self.vgem, "alloc", 5 * vgem_scale)
        self.expect(pod, self.vgem, "submit", 3 * vgem_scale)
        self.expect(pod, self.vgem, "wait", 2 * vgem_scale)
        self.expect(pod, self.virtio, "submit", 6 * virtio_scale)
        self.expect(pod, self.virtio, "alloc", (4 + 1) * virtio_scale)
        self.expect(pod, self.virtio, "wait", 7 * virtio_scale)

    # --- the run -----------------------------------------------------------------------------

    def allocation_state(self) -> dict:
        testdrm = Path(device_node(self.testdrm, "card")).name if self.testdrm else None
        return allocations(self.mode, testdrm, self.virtio.id)

    def start_agent(self) -> Agent:
        allocations = {
            "pod_resources": {
                "enabled": True,
                "socket": str(PODRESOURCES),
                "interval_seconds": ALLOCATIONS_INTERVAL,
                "timeout_seconds": RPC_TIMEOUT,
            }
        }
        config = {
            "probe": {
                "mode": self.mode,
                "jobs": self.jobs,
                **({"hook": self.hook} if self.hook else {}),
                **({"loader": self.loader} if self.loader else {}),
                **({"durations_exit": self.durations_exit} if self.durations_exit else {}),
            },
            "attribution": {
                "cri": {"endpoint": f"unix://{self.cri_socket}", "timeout_seconds": RPC_TIMEOUT},
                **(allocations if self.records else {}),
            },
            "export": {
                "prometheus": PROMETHEUS,
                "otlp": OTLP,
            },
        }
        agent = Agent(self.out, config, launcher=self.launcher)
        self.attach_seconds = agent.attach()
        return agent

    def scrape(self) -> Samples:
        return scrape(self.out / "metrics.txt")

    @staticmethod
    def otlp_points(receiver: OtlpReceiver) -> list[dict]:
        """kubenpu.ioctl in the last push; a push before the first count has none."""
        if not receiver.requests or not any(
            m.name == "kubenpu.ioctl" for _, m in receiver.metrics()
        ):
            return []
        values = receiver.values("kubenpu.ioctl")
        return [{"attributes": dict(attrs), "value": v} for attrs, v in values.items()]

    def settle(self, receiver: OtlpReceiver) -> tuple[dict, list]:
        """Wait until both outputs show every expected count (or time out), then return them."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        want = sum(self.expected.values())
        while True:
            prom, otlp = self.scrape(), self.otlp_points(receiver)
            got_prom = sum(ioctl_counts(prom).values())
            got_otlp = sum(p["value"] for p in otlp)
            # The calls' durations come with the same read, a moment after their counts.
            timed = sum(ioctl_counts(prom, TIMED_COUNT).values()) if self.timed else want
            if (min(got_prom, got_otlp, timed) >= want) or time.monotonic() > deadline:
                return prom, otlp
            time.sleep(1)

    @property
    def timed(self) -> bool:
        """Whether this run's probe times calls (the CO-RE object in aggregate mode)."""
        return self.mode == "aggregate" and self.loader != "bcc"

    @property
    def cri_socket(self) -> str:
        return f"/run/kubenpu-cri-{self.mode}.sock"

    def run(self) -> dict:
        pod_a, pod_b = pods(self.mode)
        cri = CriTestServer()
        cri.start(self.cri_socket)
        add_container(cri, pod_a)
        systemd_cgroup(pod_a).mkdir(parents=True)
        receiver = OtlpReceiver(port=OTLP_PORT)
        kubelet = (
            start_podresources(self.allocation_state(), self.out / "podresources.json")
            if self.records
            else None
        )
        agent = self.start_agent()
        try:
            self.workload(pod_a, systemd_cgroup(pod_a), vgem_scale=1, virtio_scale=1)
            # Pod B appears only now: its first call must already be attributed.
            add_container(cri, pod_b)
            self.workload(pod_b, cgroupfs_cgroup(pod_b), vgem_scale=3, virtio_scale=2)
            # A host process outside any pod: counted with empty pod labels, reason not_pod.
            host = CGROUP / "system.slice" / "host-tool.service"
            self.workload(None, host, vgem_scale=2, virtio_scale=0)
            self.unlisted_device(systemd_cgroup(pod_a))
            # Before the recording's pods come and go (a gone cgroup's keys are forgotten).
            durations, returns = kernel_durations(), self.returns.report()
            if self.records:
                self.record(cri, pod_a, pod_b)
            prom, otlp = self.settle(receiver)
        finally:
            agent.stop()
            receiver.stop()
            cri.stop()
            if kubelet:
                kubelet.terminate()
                kubelet.wait()
        return {
            "kernel": os.uname().release,
            "lockdown": Path("/sys/kernel/security/lockdown").read_text().strip(),
            "mode": self.mode,
            "attach_seconds": self.attach_seconds,
            "expected": [{"labels": list(k), "value": v} for k, v in sorted(self.expected.items())],
            "expected_unattributed": dict(self.unattributed),
            "devices": {d.vendor: d.id for d in (self.vgem, self.virtio)},
            "testdrm_skipped": self.testdrm_skipped,
            "prometheus": prom,
            "otlp": otlp,
            "durations": durations,
            "returns": returns,
            "agent_log": agent.log(),
        }

    @property
    def records(self) -> bool:
        return self.mode == MODES[0] and RECORD_ARG in Path("/proc/cmdline").read_text().split()

    def record(self, cri: CriTestServer, pod_a: dict, pod_b: dict) -> None:
        """A scrape, then rounds of calls (every pod, the host, and batch pods that each live two
        rounds: a new one, so a CRI lookup, per round) each followed by a timestamped scrape of
        /metrics; saved for the host. The calls are expected like any other."""
        raw = self.out / "recording.txt"
        scrapes = []
        holders: list[subprocess.Popen] = []
        render = render_pod(self.mode)
        add_container(cri, render)
        systemd_cgroup(render).mkdir(parents=True)
        for i in range(RECORD_ROUNDS + 1):
            if i:
                holders += self.hold_testdrm(render)
                add_container(cri, batch_pod(self.mode, i))
                for batch in [batch_pod(self.mode, j) for j in (i - 1, i) if j]:
                    self.workload(batch, cgroupfs_cgroup(batch), vgem_scale=1, virtio_scale=1)
                self.workload(pod_a, systemd_cgroup(pod_a), vgem_scale=1, virtio_scale=i % 3)
                self.workload(pod_b, cgroupfs_cgroup(pod_b), vgem_scale=2, virtio_scale=i)
                self.workload(None, CGROUP / "system.slice" / "host-tool.service", 1, 0)
                time.sleep(RECORD_INTERVAL)
            scrape(raw)
            scrapes.append({"time": time.time(), "text": raw.read_text()})
        for holder in holders:
            holder.kill()
            holder.wait()
        record = {"node": os.uname().nodename, "interval": RECORD_INTERVAL, "scrapes": scrapes}
        (self.out / "recording.json").write_text(json.dumps(record))

    def hold_testdrm(self, pod: dict) -> list[subprocess.Popen]:
        """A process of `pod` holding a test-driver client with RECORD_HOLD's calls (none
        without the driver); its counted vgem call is expected."""
        if self.testdrm is None:
            return []
        node = device_node(self.testdrm, "renderD")
        submits, allocs = RECORD_HOLD
        calls = [
            Call.drm(device_node(self.vgem, "card"), CREATE_DUMB, 1),
            Call.drm(node, TESTDRM_SUBMIT, submits),
            Call.drm(node, TESTDRM_ALLOC, allocs),
        ]
        argv = drmcall_argv(calls, systemd_cgroup(pod))
        holder = subprocess.Popen([argv[0], "--hold", *argv[1:]], stdout=subprocess.PIPE)
        for _ in calls:  # its report lines: the calls are made, the client held
            holder.stdout.readline()
        self.expect(pod, self.vgem, "alloc", 1)
        return [holder]

    def unlisted_device(self, cgroup: Path) -> None:
        """bochs (QEMU's bochs-display) is a DRM device without a vendor plug-in: never counted."""
        card = device_node(self.bochs, "card")
        drmcall([Call.drm(card, CREATE_DUMB, 9), Call.drm(card, SYNCOBJ_WAIT, 9)], cgroup)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    for mode in sys.argv[2:] or MODES:
        (out / mode).mkdir(parents=True, exist_ok=True)
        result = Scenario(out / mode, mode).run()
        (out / mode / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        print(f"e2e {mode} done on {result['kernel']}; attach took {result['attach_seconds']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
