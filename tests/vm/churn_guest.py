"""Pod churn against a real containerd, run as root inside the QEMU guest (see tests/vm/churn.sh).

Reuses node_guest's containerd, images and CRI client (it plays kubelet), and runs the agent once
per probe mode (aggregate, then events). Scenarios, per mode:

  oneshot: N containers each make one DRM call and exit at once; containerd and runc remove the
      container's cgroup right after (as on a real node). Each call must be counted under its
      container's labels, none as unattributed{not_indexed}.
  restart: while the containers of a pod make calls, containerd is killed and started again:
      one container starts just before the kill and makes its first calls while containerd is
      down, another makes calls before, during and after. Every call must end up on its pod.

The expected counts come from drmcall's arguments (it issues exactly COUNT calls per step, each
counted at drm_ioctl's entry whatever the driver answers). Writes /out/result.json;
tests/test_churn_vm.py asserts on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import cri_test_pb2 as pb
import grpc
from guestlib import (
    ATTACH_TIMEOUT,
    CGROUP,
    CREATE_DUMB,
    MODES,
    PROMETHEUS,
    Agent,
    drmcall_argv,
    run_scenario,
)
from node_guest import FOREVER, HERE, Node, Pod, vgem, wait_for

ONESHOTS = int(os.environ.get("KUBENPU_CHURN_ONESHOTS", "8"))
DOWN_SECONDS = 12  # containerd stays down this long


class Churn(Node):
    def __init__(self, out: Path) -> None:
        super().__init__(out)
        self.series = (self.devices["vgem"].id, "vgem", "alloc")
        self.containerd: subprocess.Popen | None = None

    # --- agent and containerd ----------------------------------------------------------------

    def start_agent_in(self, mode: str) -> Agent:
        config = {"probe": {"mode": mode}, "export": {"prometheus": PROMETHEUS}}
        agent = Agent(self.out, config, name=f"agent-{mode}")
        agent.attach(ATTACH_TIMEOUT)
        return agent

    def restart_containerd(self) -> None:
        """SIGKILL (a crash or an upgrade), wait, start it again on the same state."""
        self.containerd.send_signal(signal.SIGKILL)
        self.containerd.wait(timeout=30)
        self.mark("containerd killed")
        time.sleep(DOWN_SECONDS)
        log = open(self.out / "containerd-restarted.log", "w")  # noqa: SIM115
        self.containerd = subprocess.Popen(
            ["containerd", "--config", str(HERE / "containerd/config.toml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for("containerd's CRI after the restart", self._cri_up)
        self.mark("containerd restarted")

    def _cri_up(self) -> bool:
        try:
            return bool(self.kubelet.version().runtime_name)
        except grpc.RpcError:
            return False

    # --- scenarios ---------------------------------------------------------------------------

    def drmcall(self, n: int) -> list[str]:
        """drmcall's argv for n calls of CREATE_DUMB on vgem's card node."""
        return drmcall_argv(self.calls([vgem(CREATE_DUMB, "alloc", n)]))

    def expect(self, pod: Pod, name: str, calls: int) -> None:
        self.expected[(pod.namespace, pod.name, name, *self.series)] += calls

    def oneshot(self, mode: str) -> dict:
        pod = Pod(f"churn-{mode}", "oneshot", f"0c0ffee0-0000-4000-8000-{len(mode):012x}")
        self.kubelet.run_pod(pod)
        gone = 0
        for i in range(ONESHOTS):
            name = f"c{i}"
            cid = self.kubelet.start_container(pod, name, 0, self.drmcall(1))
            self.expect(pod, name, 1)
            cgroup = CGROUP / pod.cgroup_parent.lstrip("/") / cid
            wait_for(f"{name} to exit", lambda c=cid: self._exited(c))
            gone += self._removed(cgroup)
        self.mark(f"{mode}: {ONESHOTS} one-call containers ran")
        return {"pod": [pod.namespace, pod.name], "cgroups_removed": gone}

    @staticmethod
    def _removed(cgroup: Path) -> bool:
        """Whether the runtime removed the container's cgroup (what makes this scenario hard)."""
        deadline = time.monotonic() + 30
        while cgroup.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return not cgroup.exists()

    def _exited(self, cid: str) -> bool:
        request = pb.ContainerStatusRequest(container_id=cid)
        status = self.kubelet.call("ContainerStatus", request, pb.ContainerStatusResponse).status
        if status.state != pb.CONTAINER_EXITED:
            return False
        if status.exit_code:
            raise SystemExit(f"container {cid} exited {status.exit_code}")
        return True

    def restart(self, mode: str) -> dict:
        pod = Pod(f"restart-{mode}", "trainer", f"0c0ffee0-0000-4000-9000-{len(mode):012x}")
        self.kubelet.run_pod(pod)

        def run(n: int) -> str:
            return " ".join(self.drmcall(n)) + " >/dev/null"

        # steady: calls before, during and after the outage; late: first call during it. Each
        # execs sleep once its calls are made and exits if one fails, so a count short of the
        # calls is the agent's, not the workload's. drmcall's report goes nowhere: while
        # containerd is down nothing reads the container's output.
        steps = {
            "steady": ([run(2), "sleep 6", run(3), f"sleep {DOWN_SECONDS + 8}", run(4)], 9),
            "late": (["sleep 5", run(7)], 7),
        }
        pids = {}
        for name, (sh, calls) in steps.items():
            script = " && ".join([*sh, f"exec sleep {FOREVER}"])
            cid = self.kubelet.start_container(pod, name, 0, ["/bin/sh", "-c", script])
            pids[name] = self.kubelet.status(cid)["pid"]
            self.expect(pod, name, calls)
        self.mark(f"{mode}: restart pod started")
        self.restart_containerd()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(map(_finished, pids.values())):
            time.sleep(0.5)
        self.mark(f"{mode}: restart pod's calls made")
        return {"pod": [pod.namespace, pod.name], "done": {n: _done(p) for n, p in pids.items()}}

    def run_mode(self, mode: str) -> dict:
        self.expected = Counter()
        agent = self.start_agent_in(mode)
        self.mark(f"{mode}: agent attached")
        try:
            oneshot = self.oneshot(mode)
            restart = self.restart(mode)
            prom = self.settle(dict(self.expected))
            self.mark(f"{mode}: settled")
        finally:
            agent.stop(timeout=60)
        return {
            "oneshot": oneshot,
            "restart": restart,
            "expected": [{"labels": list(k), "value": v} for k, v in self.expected.items()],
            "scrape": prom,
            "agent_log": agent.log(),
        }

    def run(self) -> dict:
        self.containerd = self.start_containerd()
        try:
            self.import_images()
            self.mark("images imported")
            modes = {mode: self.run_mode(mode) for mode in MODES}
        finally:
            self.containerd.terminate()
            self.containerd.wait(timeout=30)
        return {
            "kernel": os.uname().release,
            "lockdown": Path("/sys/kernel/security/lockdown").read_text().strip(),
            "oneshots": ONESHOTS,
            "timings": self.timings,
            "modes": modes,
        }


def _done(pid: int) -> bool:
    """Whether a restart container's script made all its calls: its shell has exec'd sleep.
    The command line, not comm: busybox sh runs a plain `sleep 6` in its own process (a
    no-fork applet), and comm read "sleep" then."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{FOREVER}\0".encode()
    except OSError:  # exited: a step failed
        return False


def _finished(pid: int) -> bool:
    return _done(pid) or not Path(f"/proc/{pid}").exists()


if __name__ == "__main__":
    sys.exit(run_scenario("churn", lambda out: Churn(out).run()))
