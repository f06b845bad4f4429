"""The agent in its own image, run by the guest's containerd as the chart says (tests/vm/image.sh).

tests/test_image_vm.py builds the image (scripts/image.sh), renders the chart with `helm template`
and translates the DaemonSet's agent container into CRI terms in /out/pod.json: a ContainerConfig
(securityContext, mounts, env, args, resources), the files and directories kubelet would make for
its volumes, the host paths that must exist, and the probes. Here, as root in the QEMU guest, this
plays kubelet with tests/vm/node_guest.py's containerd and CRI client: it serves the image archive
from /out in a registry of its own (Debian's docker-registry on 127.0.0.1:5000, filled by skopeo),
has containerd pull the chart's image reference from it through the CRI's PullImage, as kubelet
does, prepares the volumes, runs the agent pod and polls its startup probe, then runs a
workload pod whose drmcall containers report what they issued. The node is headerless first
(make_headerless), as the default images of the large managed offerings are. It records
/metrics, OTLP, the probes, and what the agent process really got (capabilities, uid, seccomp,
read-only root, the OCI spec containerd made). Writes /out/result.json; tests/test_image_vm.py
asserts on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import cri_test_pb2 as pb
from e2e_guest import Scenario
from google.protobuf import json_format
from guestlib import OTLP_PORT, read_log, run_scenario
from least_privilege_guest import process_caps
from node_guest import (
    MAIN_0,
    POD_A,
    SETTLE_TIMEOUT,
    SIDECAR,
    SOCKET,
    STEP_TIMEOUT,
    Node,
    Pod,
    wait_for,
)
from otlp_receiver import OtlpReceiver

from kubenpu.resolve.cri import LABEL_CONTAINER

CTR = ["ctr", "--address", SOCKET, "--namespace", "k8s.io"]
REGISTRY = "127.0.0.1:5000"  # tests/test_image_vm.py's image.repository; containerd/certs.d
STATUS_FIELDS = ("Uid", "Gid", "Seccomp", "NoNewPrivs")


def probe(port: int, path: str) -> dict:
    """What kubelet's httpGet probe sees: the HTTP status (0 when nothing answers) and the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return {"status": reply.status, "body": reply.read(200).decode(errors="replace")}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "body": err.read(200).decode(errors="replace")}
    except OSError:
        return {"status": 0, "body": ""}


def prepare_volumes(spec: dict) -> None:
    """kubelet's part: hostPath `Directory` must exist, DirectoryOrCreate and emptyDir are made,
    a ConfigMap becomes a directory of files."""
    missing = [d for d in spec["host_dirs"] if not Path(d).is_dir()]
    if missing:
        raise SystemExit(f"hostPath directories missing on the node: {missing}")
    for d in spec["dirs"]:
        Path(d).mkdir(parents=True, exist_ok=True)
    for path, text in spec["files"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


class AgentPod:
    """The agent pod of the chart, in the node's containerd."""

    def __init__(self, node: Node, spec: dict) -> None:
        self.node, self.spec = node, spec
        self.pod = Pod(**spec["pod"])
        self.config = json_format.ParseDict(spec["container"], pb.ContainerConfig())
        self.name = self.config.metadata.name
        self.id = ""

    def start(self) -> None:
        self.node.kubelet.run_pod(self.pod, self.config.linux.security_context.namespace_options)
        self.config.labels.update({**self.pod.labels(), LABEL_CONTAINER: self.name})
        self.config.log_path = f"{self.name}/0.log"
        self.id = self.node.kubelet.run_container(self.pod, self.config)

    @property
    def log(self) -> str:
        path = self.pod.log_directory / self.name / "0.log"
        return read_log(path) if path.exists() else ""

    def wait_started(self) -> float:
        """Poll the startup probe as kubelet does, within its budget; the seconds it took."""
        startup = self.spec["probes"]["startup"]
        started = time.monotonic()

        def up() -> bool:
            state = self.status()["state"]
            if state != "CONTAINER_RUNNING":
                raise SystemExit(f"agent container {state}; its log:\n{self.log}")
            return probe(startup["port"], startup["path"])["status"] == 200

        wait_for("the startup probe", up, startup["budget_seconds"])
        return round(time.monotonic() - started, 1)

    def status(self) -> dict:
        request = pb.ContainerStatusRequest(container_id=self.id, verbose=True)
        reply = self.node.kubelet.call("ContainerStatus", request, pb.ContainerStatusResponse)
        info = json.loads(reply.info["info"])
        return {
            "state": pb.ContainerState.Name(reply.status.state),
            "image": reply.status.image.image,
            "pid": info["pid"],
            "spec": info["runtimeSpec"],
        }

    def exec(self, argv: list[str]) -> dict:
        request = pb.ExecSyncRequest(container_id=self.id, cmd=argv, timeout=STEP_TIMEOUT)
        reply = self.node.kubelet.call("ExecSync", request, pb.ExecSyncResponse)
        return {"exit_code": reply.exit_code, "stderr": reply.stderr.decode()}

    def process(self) -> dict:
        """What the agent process got from runc, read from the node's /proc."""
        status = self.status()
        pid = status["pid"]
        fields = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":\t" in line
        )
        return {
            "caps": process_caps(pid),
            **{f: fields[f].split() for f in STATUS_FIELDS},
            "cmdline": Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1],
            "image": status["image"],
            "spec": status["spec"],
            # The root is read-only: a write there fails, while the emptyDir /tmp takes it.
            "write_root": self.exec(["sh", "-c", "touch /rootfs-check"]),
            "write_tmp": self.exec(["sh", "-c", "touch /tmp/tmp-check"]),
        }

    def stop(self) -> None:
        # kubelet's grace period: SIGTERM, then SIGKILL after 30 s.
        request = pb.StopContainerRequest(container_id=self.id, timeout=30)
        self.node.kubelet.call("StopContainer", request, pb.StopContainerResponse)


class Registry:
    """Debian's docker-registry (the distribution API) on REGISTRY, plain HTTP, which
    tests/vm/containerd/certs.d tells containerd; its log says what containerd fetched."""

    def __init__(self, out: Path) -> None:
        work = Path("/tmp/registry")
        work.mkdir()
        config = {  # JSON is YAML
            "version": 0.1,
            "log": {"accesslog": {"disabled": False}},
            "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
            "http": {"addr": REGISTRY},
        }
        (work / "config.yml").write_text(json.dumps(config))
        self.log_path = out / "registry.log"
        log = self.log_path.open("w")
        self._proc = subprocess.Popen(
            ["docker-registry", "serve", str(work / "config.yml")], stdout=log, stderr=log
        )
        wait_for("the registry", self._answers)

    def _answers(self) -> bool:
        if self._proc.poll() is not None:
            raise SystemExit(f"docker-registry exited {self._proc.returncode}; see registry.log")
        try:
            with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5):
                return True
        except OSError:
            return False

    def push(self, archive: Path, image: str) -> None:
        """What a user does with the release's archive (docs/upgrade.md): skopeo copy."""
        subprocess.run(
            ["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
             f"oci-archive:{archive}", f"docker://{image}"],
            check=True,
        )  # fmt: skip

    def manifest_requests(self, repository: str) -> int:
        """How many times the manifest of `repository` was fetched (GET, not HEAD)."""
        return self.log_path.read_text().count(f'"GET /v2/{repository}/manifests/')

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)


def images() -> list[str]:
    """The image names containerd knows."""
    listing = subprocess.run([*CTR, "images", "ls", "-q"], check=True, capture_output=True)
    return listing.stdout.decode().split()


def settle_otlp(receiver: OtlpReceiver, want: float) -> list[dict]:
    """The last OTLP push once it holds every expected call (or at the deadline)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        points = Scenario.otlp_points(receiver)
        if sum(p["value"] for p in points) >= want or time.monotonic() > deadline:
            return points
        time.sleep(1)


def make_headerless() -> dict:
    """The node image of GKE (COS), EKS (AL2023), Bottlerocket or Talos: no kernel headers, no
    /lib/modules/<release>/build, no kheaders. The guest root is an overlay on tmpfs, so this
    boot's deletions leave the cached root as it was. Returns what is left to look at."""
    release = os.uname().release
    modules = Path("/lib/modules", release)
    doomed = [*Path("/usr/src").glob("linux-*"), modules / "build", modules / "source"]
    doomed += modules.rglob("kheaders.ko*")
    for path in doomed:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    subprocess.run(["depmod", "-a", release], check=True)
    return {
        "usr_src": sorted(p.name for p in Path("/usr/src").iterdir()),
        "build": (modules / "build").exists(),
        "kheaders_module": sorted(str(p) for p in modules.rglob("kheaders.ko*")),
        "kheaders_loaded": Path("/sys/kernel/kheaders.tar.xz").exists(),
    }


def run(out: Path) -> dict:
    spec = json.loads((out / "pod.json").read_text())
    headerless = make_headerless()
    node = Node(out)
    containerd = node.start_containerd()
    receiver = OtlpReceiver(port=OTLP_PORT)
    agent = AgentPod(node, spec)
    registry = Registry(out)
    image = spec["container"]["image"]["image"]
    repository = image.partition("/")[2].rpartition(":")[0]
    try:
        registry.push(out / spec["image_archive"], image)
        node.mark("image pushed")
        pushed_gets = registry.manifest_requests(repository)  # skopeo's own, if any
        pulled = node.kubelet.pull(image)
        pulled_gets = registry.manifest_requests(repository) - pushed_gets
        known = images()  # while containerd runs
        node.mark("image pulled")
        node.import_images()  # the pause and workload images, made in the guest
        node.mark("images imported")
        prepare_volumes(spec)
        agent.start()
        startup_seconds = agent.wait_started()
        node.mark("agent started")
        node.kubelet.run_pod(POD_A)
        node.run_entrypoint(POD_A, "main", 0, MAIN_0)
        node.run_entrypoint(POD_A, "sidecar", 0, SIDECAR)
        node.mark("workload ran")
        prom = node.settle(dict(node.expected))
        otlp = settle_otlp(receiver, sum(node.expected.values()))
        node.mark("counts settled")
        probes = {k: probe(p["port"], p["path"]) for k, p in spec["probes"].items()}
        process = agent.process()
    finally:
        if agent.id:
            agent.stop()
        (out / "agent.log").write_text(agent.log)
        receiver.stop()
        registry.stop()
        containerd.terminate()
        containerd.wait(timeout=30)
    return {
        "kernel": os.uname().release,
        "headerless": headerless,
        "images": known,
        "pulled": pulled,
        "manifest_requests": pulled_gets,
        "startup_seconds": startup_seconds,
        "timings": node.timings,
        "expected": [{"labels": list(k), "value": v} for k, v in node.expected.items()],
        "prometheus": prom,
        "otlp": otlp,
        "probes": probes,
        "process": process,
        "agent_log": agent.log,
    }


if __name__ == "__main__":
    sys.exit(run_scenario("image", run))
