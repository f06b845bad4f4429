"""`make demo`, inside the QEMU guest (tests/vm/demo.sh): sample pods use the devices while the
agent runs, then what a person looks at: `kubenpuctl devices`, `kubenpuctl top --once` and the key
series on /metrics.

It plays kubelet and the runtime as the e2e scenario does (tests/vm/e2e_guest.py: cgroups, a CRI
server, a PodResources server), with tests/vm/kmod's test driver loaded, whose clients print
device time and memory in fdinfo and whose hwmon has power and energy (docs/fdinfo.md):

- team-d/render-0 holds a test-driver client and submits SUBMIT_RATE times a second (each 1 ms
  of render time and 2 J of the device's energy), and is allocated that device;
- team-a/trainer-0 calls vgem and virtio-gpu, which only team-e/idle-0 is allocated;
- team-e/idle-0 holds virtio-gpu and never calls: an idle allocation (e2e_guest.allocations).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers

from cri_server import CriTestServer
from e2e_guest import allocations, render_pod
from guestlib import (
    CREATE_DUMB,
    METRICS_URL,
    PODRESOURCES,
    PROMETHEUS,
    TESTDRM,
    TESTDRM_ALLOC,
    TESTDRM_SUBMIT,
    VGEM_FENCE_ATTACH,
    VIRTGPU_EXECBUFFER,
    Agent,
    Call,
    add_container,
    device_node,
    drmcall_argv,
    load_testdrm,
    scrape,
    start_podresources,
    systemd_cgroup,
)

from kubenpu.discovery import discover

MODE = "aggregate"
# drmcall paces in batches of 1,000 calls: at these rates a batch every 1 or 2 s, so every agent
# read (5 s) and top's window see steady rates.
SUBMIT_RATE = 500  # test-driver SUBMITs per second: 0.5 s of render per s (25 % of 2), 1 kW
CALL_RATE = 1000  # trainer-0's calls per second on each of vgem and virtio-gpu
# The test driver's hwmon to match (its energy counter adds 2 J per SUBMIT): power and its cap.
TESTDRM_PARAMETERS = Path("/sys/module/kubenpu_testdrm/parameters")
POWER_UW, POWER_CAP_UW = 1_000_000_000, 1_200_000_000
FOREVER = 10**7  # calls in a paced step: more than the demo lasts
FDINFO_INTERVAL = 2  # fdinfo.interval_seconds (telemetry and the energy split read with it)
ALLOCATIONS_INTERVAL = 2  # attribution.pod_resources.interval_seconds
WARMUP = 12  # seconds of use before looking: two agent reads of the kernel's counts (5 s each)
# top's two reads, two agent reads apart: the agent refreshes its counters every 5 s.
TOP = ["kubenpuctl", "top", "--once", "--interval", "10", "--url", METRICS_URL]
TRAINER = {
    "id": "a0" * 32,
    "namespace": "team-a",
    "pod": "trainer-0",
    "container": "main",
    "pod_uid": "0b8f1a52-6c5e-4d0e-9a11-3f5a0c2b7e00",
}
CRI_SOCKET = "/run/kubenpu-cri-demo.sock"
# The series a person reads first, as kubenpuctl top shows them.
KEY_SERIES = re.compile(
    r"^kubenpu_(ioctl_total|engine_busy_seconds_total|memory_bytes|energy_joules_total"
    r"|device_power_watts|device_temperature_celsius|device_allocated"
    r"|device_allocated_idle_for_seconds|device_unallocated_calls_total)\{"
)


def start_agent(out: Path) -> Agent:
    config = {
        "probe": {"mode": MODE},
        "fdinfo": {"interval_seconds": FDINFO_INTERVAL},
        "attribution": {
            "cri": {"endpoint": f"unix://{CRI_SOCKET}"},
            "pod_resources": {
                "enabled": True,
                "socket": str(PODRESOURCES),
                "interval_seconds": ALLOCATIONS_INTERVAL,
            },
        },
        "export": {"prometheus": PROMETHEUS},
    }
    agent = Agent(out, config)
    agent.attach()
    return agent


def workloads(found: list) -> list[subprocess.Popen]:
    """The pods' processes, each in its container's cgroup, calling until killed."""
    devices = {d.vendor: d for d in found if d.vendor}
    testdrm = next(d for d in found if d.id == TESTDRM)
    render = render_pod(MODE)
    node = device_node(testdrm, "renderD")
    # One counted vgem call first: the agent's fdinfo reader follows the pod's processes.
    hold = [
        Call.drm(device_node(devices["vgem"], "card"), CREATE_DUMB, 1),
        Call.drm(node, TESTDRM_ALLOC, 8),
        Call.drm(node, TESTDRM_SUBMIT, FOREVER),
    ]
    calls = [
        Call.drm(device_node(devices["vgem"], "card"), VGEM_FENCE_ATTACH, FOREVER),
        Call.drm(device_node(devices["virtio_gpu"], "renderD"), VIRTGPU_EXECBUFFER, FOREVER),
    ]
    procs = []
    for pod, steps, rate in ((render, hold, SUBMIT_RATE), (TRAINER, calls[:1], CALL_RATE)):
        cgroup = systemd_cgroup(pod)
        cgroup.mkdir(parents=True, exist_ok=True)
        argv = drmcall_argv(steps, cgroup, rate)
        procs.append(subprocess.Popen([argv[0], "--hold", *argv[1:]], stdout=subprocess.DEVNULL))
    # virtio-gpu in a process of its own: drmcall's steps run one after the other.
    argv = drmcall_argv(calls[1:], systemd_cgroup(TRAINER), CALL_RATE)
    procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
    return procs


def show(title: str, argv: list[str]) -> None:
    print(f"== {title} ==", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    print(done.stdout + done.stderr, end="", flush=True)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    skipped = load_testdrm()
    if skipped:
        raise SystemExit(f"the test DRM driver did not load: {skipped}")
    (TESTDRM_PARAMETERS / "power_uw").write_text(str(POWER_UW))
    (TESTDRM_PARAMETERS / "power_cap_uw").write_text(str(POWER_CAP_UW))
    found = discover("/")
    testdrm = next(d for d in found if d.id == TESTDRM)
    virtio = next(d for d in found if d.vendor == "virtio_gpu")
    cri = CriTestServer()
    cri.start(CRI_SOCKET)
    for pod in (render_pod(MODE), TRAINER):
        add_container(cri, pod)
    card = Path(device_node(testdrm, "card")).name
    kubelet = start_podresources(allocations(MODE, card, virtio.id), out / "podresources.json")
    agent = start_agent(out)
    procs = workloads(found)
    try:
        print(f"== agent attached in {agent.attach_seconds:.1f}s; pods at work for {WARMUP}s ==")
        time.sleep(WARMUP)
        show("kubenpuctl devices", ["kubenpuctl", "devices"])
        show("kubenpuctl top --once", TOP)
        scrape(out / "metrics.txt")
        lines = (out / "metrics.txt").read_text().splitlines()
        print("== key series on /metrics ==")
        print("\n".join(line for line in lines if KEY_SERIES.match(line)), flush=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        agent.stop()
        kubelet.terminate()
        kubelet.wait()
        cri.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
