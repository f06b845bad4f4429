"""Pod churn against a real containerd, run as root inside the QEMU guest (see tests/vm/churn.sh).

Reuses node_guest's containerd, images and CRI client (it plays kubelet), and runs the agent once
per probe mode (aggregate, then events). Scenarios, per mode:

  oneshot: N containers each make one DRM call and exit at once; containerd and runc remove the
      container's cgroup right after (as on a real node). Each call must be counted under its
      container's labels, none as unattributed{not_indexed}.
  restart: containerd is killed and started again around calls in a pod's two containers
      (drmcall run from the guest in each container's cgroup): steady's before, during and
      after the outage, late's first ones during it. Every call must end up on its pod.

The expected counts are drmcall's COUNT per step (oneshot: its arguments; restart: its report
of what it issued), each call counted at drm_ioctl's entry whatever the driver answers. Writes
/out/result.json; tests/test_churn_vm.py asserts on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cri_test_pb2 as pb
import grpc
from guestlib import (
    ATTACH_TIMEOUT,
    CGROUP,
    CREATE_DUMB,
    MODES,
    PROMETHEUS,
    SLOW,
    Agent,
    drmcall_argv,
    reports,
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

    def restart_containerd(self, while_down: Callable[[], None]) -> None:
        """SIGKILL (a crash or an upgrade), while_down(), wait, start it again on the same
        state."""
        self.containerd.send_signal(signal.SIGKILL)
        self.containerd.wait(timeout=30)
        self.mark("containerd killed")
        down = time.monotonic()
        while_down()
        time.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - down)))
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
        deadline = time.monotonic() + 30 * SLOW
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
        """steady: calls before, during and after a containerd outage; late: its first calls
        during it. The calls are made by drmcall from the guest inside each container's cgroup
        (--cgroup), at those moments exactly; the containers themselves only sleep. (A shell
        in the container making them lost its last calls in 2 of 4 cold CI runs: containerd's
        restart ended the shell, not the agent's count.)"""
        pod = Pod(f"restart-{mode}", "trainer", f"0c0ffee0-0000-4000-9000-{len(mode):012x}")
        self.kubelet.run_pod(pod)
        cgroups = {}
        for name in ("steady", "late"):
            cid = self.kubelet.start_container(pod, name, 0, ["sleep", FOREVER])
            cgroups[name] = CGROUP / pod.cgroup_parent.lstrip("/") / cid
        self.mark(f"{mode}: restart pod started")

        def calls_in(name: str, n: int) -> None:
            calls = self.calls([vgem(CREATE_DUMB, "alloc", n)])
            argv = drmcall_argv(calls, cgroups[name])
            reports(subprocess.run(argv, check=True, capture_output=True, text=True).stdout, calls)
            self.expect(pod, name, n)

        calls_in("steady", 2)
        self.restart_containerd(lambda: (calls_in("steady", 3), calls_in("late", 7)))
        calls_in("steady", 4)
        self.mark(f"{mode}: restart pod's calls made")
        return {"pod": [pod.namespace, pod.name]}

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


if __name__ == "__main__":
    sys.exit(run_scenario("churn", lambda out: Churn(out).run()))
