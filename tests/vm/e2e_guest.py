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
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers

from cri_server import CriTestServer
from otlp_receiver import OtlpReceiver
from prometheus_client.parser import text_string_to_metric_families

from kubenpu.discovery import discover

HERE = Path(__file__).resolve().parent
PY = sys.executable
CGROUP = Path("/sys/fs/cgroup")
METRICS_URL = "http://127.0.0.1:8080/metrics"
OTLP_PORT = 4317
ATTACH_TIMEOUT = 300
SETTLE_TIMEOUT = 60

MODES = ("aggregate", "events")


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


# DRM ioctl numbers (nr, struct size) the workloads use; see kubenpu/vendors for the tables.
CREATE_DUMB = (0xB2, 32)  # core, alloc
SYNCOBJ_WAIT = (0xC3, 40)  # core, wait
VERSION = (0x00, 64)  # core, not counted
GET_CAP = (0x0C, 16)  # core, not counted
VGEM_FENCE_ATTACH = (0x41, 16)  # vgem, submit
VGEM_FENCE_SIGNAL = (0x42, 8)  # vgem, not counted
VIRTGPU_EXECBUFFER = (0x42, 48)  # virtio_gpu, submit
VIRTGPU_RESOURCE_CREATE = (0x44, 56)  # virtio_gpu, alloc
VIRTGPU_WAIT = (0x48, 8)  # virtio_gpu, wait
TCGETS = 0x5401  # not a DRM ioctl at all: type byte 'T'


def read_log(path: Path) -> str:
    """The text of a log another process is appending to. The /out share (9p) sometimes answers
    ENODATA to such a read (seen on 7.3); a moment later the same read succeeds."""
    for _ in range(20):
        try:
            return path.read_text()
        except OSError:
            time.sleep(0.1)
    return path.read_text()


def scrape(save_to: Path | None = None) -> dict[str, list]:
    """The agent's /metrics as {sample name: [{labels, value}]}; the raw text saved if asked."""
    text = urllib.request.urlopen(METRICS_URL, timeout=5).read().decode()
    if save_to:
        save_to.write_text(text)
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append({"labels": s.labels, "value": s.value})
    return found


def systemd_cgroup(pod: dict) -> Path:
    uid = pod["pod_uid"].replace("-", "_")
    return (
        CGROUP
        / "kubepods.slice"
        / "kubepods-burstable.slice"
        / f"kubepods-burstable-pod{uid}.slice"
        / f"cri-containerd-{pod['id']}.scope"
    )


def cgroupfs_cgroup(pod: dict) -> Path:
    return CGROUP / "kubepods" / "besteffort" / f"pod{pod['pod_uid']}" / pod["id"]


def step(path: str, ioctl: tuple[int, int], count: int) -> dict:
    return {"path": path, "nr": ioctl[0], "size": ioctl[1], "count": count}


def run_workload(cgroup: Path, plan: list[dict]) -> None:
    cgroup.mkdir(parents=True, exist_ok=True)
    plan_file = Path("/tmp") / f"plan-{time.monotonic_ns()}.json"
    plan_file.write_text(json.dumps(plan))
    subprocess.run([PY, str(HERE / "workload.py"), str(cgroup), str(plan_file)], check=True)


class Scenario:
    launcher: tuple[str, ...] = ()  # what the agent runs under (setpriv for least privilege)

    def __init__(self, out: Path, mode: str) -> None:
        self.out = out
        self.mode = mode
        self.expected: Counter[tuple[str, ...]] = Counter()
        self.unattributed: Counter[str] = Counter()
        subprocess.run(["modprobe", "bochs"], check=True)  # idempotent
        found = discover("/")
        devices = {d.vendor: d for d in found if d.vendor}
        self.vgem, self.virtio = devices["vgem"], devices["virtio_gpu"]
        self.bochs = next(d for d in found if d.driver == "bochs-drm")

    def node(self, device, prefix: str) -> str:
        return next(n.path for n in device.nodes if n.name.startswith(prefix))

    def expect(self, pod: dict | None, device, kind: str, n: int) -> None:
        who = (pod["namespace"], pod["pod"], pod["container"]) if pod else ("", "", "")
        if n == 0:
            return
        if pod is None:
            self.unattributed["not_pod"] += n
        self.expected[(*who, device.id, device.vendor, kind)] += n

    def workload(self, pod: dict | None, cgroup: Path, vgem_scale: int, virtio_scale: int) -> None:
        vg, vr = self.node(self.vgem, "card"), self.node(self.virtio, "renderD")
        vc = self.node(self.virtio, "card")
        plan = [
            step(vg, CREATE_DUMB, 5 * vgem_scale),
            step(vg, VGEM_FENCE_ATTACH, 3 * vgem_scale),
            step(vg, SYNCOBJ_WAIT, 2 * vgem_scale),
            step(vr, VIRTGPU_EXECBUFFER, 6 * virtio_scale),
            step(vr, VIRTGPU_RESOURCE_CREATE, 4 * virtio_scale),
            step(vr, VIRTGPU_WAIT, 7 * virtio_scale),
            step(vc, CREATE_DUMB, 1 * virtio_scale),
            # Calls that must not count: outside the tables, or not DRM ioctls at all.
            step(vg, VERSION, 4),
            step(vg, GET_CAP, 4),
            step(vg, VGEM_FENCE_SIGNAL, 4),
            step(vr, VERSION, 4),
            {"path": vr, "cmd": TCGETS, "size": 64, "count": 4},
        ]
        run_workload(cgroup, plan)
        self.expect(pod, self.vgem, "alloc", 5 * vgem_scale)
        self.expect(pod, self.vgem, "submit", 3 * vgem_scale)
        self.expect(pod, self.vgem, "wait", 2 * vgem_scale)
        self.expect(pod, self.virtio, "submit", 6 * virtio_scale)
        self.expect(pod, self.virtio, "alloc", (4 + 1) * virtio_scale)
        self.expect(pod, self.virtio, "wait", 7 * virtio_scale)

    # --- the run -----------------------------------------------------------------------------

    def start_agent(self) -> subprocess.Popen:
        cfg = self.out / "agent.yaml"
        cfg.write_text(
            json.dumps(  # JSON is YAML
                {
                    "probe": {"mode": self.mode},
                    "attribution": {"cri": {"endpoint": f"unix://{self.cri_socket}"}},
                    "export": {
                        "prometheus": {"enabled": True, "host": "127.0.0.1", "port": 8080},
                        "otlp": {
                            "enabled": True,
                            "endpoint": f"http://127.0.0.1:{OTLP_PORT}",
                            "protocol": "grpc",
                            "interval_seconds": 1,
                        },
                    },
                }
            )
        )
        log = open(self.out / "agent.log", "w")  # noqa: SIM115 - lives as long as the agent
        started = time.monotonic()
        agent = subprocess.Popen(
            [*self.launcher, PY, "-m", "kubenpu.agent", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        while "attached to drm_ioctl" not in read_log(self.out / "agent.log"):
            if agent.poll() is not None or time.monotonic() - started > ATTACH_TIMEOUT:
                raise SystemExit(f"agent did not attach; see {self.out / 'agent.log'}")
            time.sleep(0.5)
        self.attach_seconds = time.monotonic() - started
        return agent

    def scrape(self) -> dict[str, list]:
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
            got_prom = sum(s["value"] for s in prom.get("kubenpu_ioctl_total", []))
            got_otlp = sum(p["value"] for p in otlp)
            if (got_prom >= want and got_otlp >= want) or time.monotonic() > deadline:
                return prom, otlp
            time.sleep(1)

    @property
    def cri_socket(self) -> str:
        return f"/run/kubenpu-cri-{self.mode}.sock"

    def run(self) -> dict:
        pod_a, pod_b = pods(self.mode)
        cri = CriTestServer()
        cri.start(self.cri_socket)
        cri.add_container(
            pod_a["id"],
            pod_a["namespace"],
            pod_a["pod"],
            pod_a["container"],
            pod_uid=pod_a["pod_uid"],
        )
        systemd_cgroup(pod_a).mkdir(parents=True)
        receiver = OtlpReceiver(port=OTLP_PORT)
        agent = self.start_agent()
        try:
            self.workload(pod_a, systemd_cgroup(pod_a), vgem_scale=1, virtio_scale=1)
            # Pod B appears only now: its first call must already be attributed.
            cri.add_container(
                pod_b["id"],
                pod_b["namespace"],
                pod_b["pod"],
                pod_b["container"],
                pod_uid=pod_b["pod_uid"],
            )
            self.workload(pod_b, cgroupfs_cgroup(pod_b), vgem_scale=3, virtio_scale=2)
            # A host process outside any pod: counted with empty pod labels, reason not_pod.
            host = CGROUP / "system.slice" / "host-tool.service"
            self.workload(None, host, vgem_scale=2, virtio_scale=0)
            self.unlisted_device(systemd_cgroup(pod_a))
            prom, otlp = self.settle(receiver)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
            receiver.stop()
            cri.stop()
        return {
            "kernel": os.uname().release,
            "lockdown": Path("/sys/kernel/security/lockdown").read_text().strip(),
            "mode": self.mode,
            "attach_seconds": self.attach_seconds,
            "expected": [{"labels": list(k), "value": v} for k, v in sorted(self.expected.items())],
            "expected_unattributed": dict(self.unattributed),
            "devices": {d.vendor: d.id for d in (self.vgem, self.virtio)},
            "prometheus": prom,
            "otlp": otlp,
            "agent_log": read_log(self.out / "agent.log"),
        }

    def unlisted_device(self, cgroup: Path) -> None:
        """bochs (QEMU's bochs-display) is a DRM device without a vendor plug-in: never counted."""
        card = self.node(self.bochs, "card")
        run_workload(cgroup, [step(card, CREATE_DUMB, 9), step(card, SYNCOBJ_WAIT, 9)])


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
