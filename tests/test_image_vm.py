"""Image + chart + agent together: the Dockerfile's image, run by a real containerd exactly as
`helm template` renders the DaemonSet, counts exactly on a real kernel.

The image comes from `make image` (scripts/image.sh: buildah, the repository's Dockerfile). The
chart is rendered by real helm; `pod_spec` below translates its agent container into the CRI
ContainerConfig kubelet would send (securityContext, hostPath/ConfigMap/emptyDir mounts, env with
fieldRefs and $(VAR) expansion, args, resources) and the probes, and refuses any field it does not
translate, so a chart change cannot slip past unexercised. tests/vm/image_guest.py imports the
image into a registry in the guest, has the guest's containerd pull the rendered image reference
from it (the CRI's PullImage, as kubelet does), runs that container and a workload pod, and
records what the agent exported and what its process got. One deviation from a cluster: pods
share the node's network namespace (the guest has no CNI); the chart's network setting is not
under test here.
Kernel: KUBENPU_IMAGE_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from guest import boot
from helpers import (
    NAMESPACE,
    ROOT,
    by_reason,
    expected_counts,
    helm_values,
    ioctl_counts,
    otlp_counts,
    render_helm,
)

KERNEL = os.environ.get("KUBENPU_IMAGE_KERNEL", "6.12")
NODE_NAME = "gpu-node-0"
AGENT_POD = {
    "namespace": NAMESPACE,
    "name": "kubenpu-x7k2p",
    "uid": "6f1d2c3b-0a9e-4b8d-9c7f-1e2d3c4b5a60",
}
# Where kubelet keeps a pod's volumes on the node.
VOLUMES = f"/var/lib/kubelet/pods/{AGENT_POD['uid']}/volumes"
# The chart as an operator with a Collector would install it; OTLP every second so the run is short.
VALUES = helm_values(
    image__repository="127.0.0.1:5000/kubenpu/kubenpu-agent",  # tests/vm/image_guest.py's REGISTRY
    config__export__otlp__enabled=True,
    config__export__otlp__endpoint="http://127.0.0.1:4317",
    config__export__otlp__interval_seconds=1,
)
# Fields of the rendered pod and container that pod_spec translates or that only the API server,
# scheduler or image pull act on. Anything else fails the test until it is translated.
POD_FIELDS = {"automountServiceAccountToken", "hostPID", "nodeSelector", "tolerations"}
POD_FIELDS |= {"affinity", "priorityClassName", "imagePullSecrets", "containers", "volumes"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports"}
CONTAINER_FIELDS |= {"startupProbe", "readinessProbe", "livenessProbe", "resources"}
CONTAINER_FIELDS |= {"securityContext", "volumeMounts"}
SECURITY_FIELDS = {"privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem"}
SECURITY_FIELDS |= {"runAsUser", "runAsNonRoot", "capabilities", "seccompProfile"}
BINARY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
# A volumeMount's mountPropagation as kubelet sends it to the runtime.
PROPAGATION = {
    "None": "PROPAGATION_PRIVATE",
    "HostToContainer": "PROPAGATION_HOST_TO_CONTAINER",
    "Bidirectional": "PROPAGATION_BIDIRECTIONAL",
}

pytestmark = pytest.mark.vm


def _one(objects: list[dict], kind: str) -> dict:
    (found,) = (o for o in objects if o["kind"] == kind)
    return found


def _unknown(obj: dict, known: set[str]) -> set[str]:
    return set(obj) - known


def _env(container: dict, pod: dict) -> list[dict[str, str]]:
    """kubelet's env: fieldRefs resolved, $(VAR) expanded from the variables defined before it."""
    fields = {"spec.nodeName": NODE_NAME, "metadata.name": pod["name"]}
    fields |= {"metadata.namespace": pod["namespace"], "metadata.uid": pod["uid"]}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            (source,) = var["valueFrom"].items()
            assert source[0] == "fieldRef", f"env {var['name']}: {source[0]} is not translated"
            env[var["name"]] = fields[source[1]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
    return [{"key": k, "value": v} for k, v in env.items()]


def _mounts(container: dict, volumes: list[dict], configmaps: dict[str, dict]) -> dict[str, Any]:
    """CRI mounts, and what kubelet makes on the node for them."""
    by_name = {v["name"]: v for v in volumes}
    mounts, files, dirs, host_dirs = [], {}, [], []
    for mount in container["volumeMounts"]:
        assert set(mount) <= {"name", "mountPath", "readOnly", "mountPropagation"}, mount
        volume = by_name[mount["name"]]
        if "hostPath" in volume:
            host = volume["hostPath"]["path"]
            kind = volume["hostPath"].get("type", "")
            assert kind in ("Directory", "DirectoryOrCreate"), f"hostPath type {kind}"
            (host_dirs if kind == "Directory" else dirs).append(host)
        elif "configMap" in volume:
            host = f"{VOLUMES}/kubernetes.io~configmap/{mount['name']}"
            data = configmaps[volume["configMap"]["name"]]["data"]
            files |= {f"{host}/{key}": text for key, text in data.items()}
        elif "emptyDir" in volume:
            host = f"{VOLUMES}/kubernetes.io~empty-dir/{mount['name']}"
            dirs.append(host)
        else:
            raise AssertionError(f"volume {mount['name']}: type not translated: {volume}")
        mounts.append(
            {
                "containerPath": mount["mountPath"],
                "hostPath": host,
                "readonly": mount.get("readOnly", False),
                "propagation": PROPAGATION[mount.get("mountPropagation", "None")],
            }
        )
    return {"mounts": mounts, "files": files, "dirs": dirs, "host_dirs": host_dirs}


def _security(container: dict, pod_spec: dict) -> dict:
    sc = container["securityContext"]
    assert not _unknown(sc, SECURITY_FIELDS), _unknown(sc, SECURITY_FIELDS)
    caps = sc.get("capabilities", {})
    profile = sc.get("seccompProfile", {"type": "Unconfined"})
    translated = {
        "capabilities": {
            "addCapabilities": caps.get("add", []),
            "dropCapabilities": caps.get("drop", []),
        },
        "privileged": sc.get("privileged", False),
        "readonlyRootfs": sc.get("readOnlyRootFilesystem", False),
        "noNewPrivs": not sc.get("allowPrivilegeEscalation", True),
        "seccomp": {
            "profileType": profile["type"],
            "localhostRef": profile.get("localhostProfile", ""),
        },
        # network: the node's, as there is no CNI in the guest (see the module docstring).
        "namespaceOptions": {
            "network": "NODE",
            "pid": "NODE" if pod_spec.get("hostPID") else "CONTAINER",
            "ipc": "POD",
        },
    }
    if "runAsUser" in sc:
        translated["runAsUser"] = {"value": str(sc["runAsUser"])}
    return translated


def _quantity(q: str) -> int:
    """Memory as bytes ("512Mi")."""
    for unit, factor in BINARY_UNITS.items():
        if q.endswith(unit):
            return int(q.removesuffix(unit)) * factor
    return int(q)


def _cpu_shares(q: str) -> int:
    """kubelet's MilliCPUToShares of a CPU request ("100m" -> 102)."""
    milli = int(q.removesuffix("m")) if q.endswith("m") else int(float(q) * 1000)
    return max(2, milli * 1024 // 1000)


def _probes(container: dict) -> dict[str, dict]:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    probes = {}
    for kind in ("startup", "readiness", "liveness"):
        p = container[f"{kind}Probe"]
        get = p["httpGet"]
        assert get.get("scheme", "HTTP") == "HTTP", "HTTPS probes are not translated"
        budget = p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
        probes[kind] = {
            "path": get["path"],
            "port": ports.get(get["port"], get["port"]),
            "budget_seconds": budget,
        }
    return probes


def pod_spec(objects: list[dict]) -> dict:
    """The rendered DaemonSet's agent container in CRI terms (tests/vm/image_guest.py reads it)."""
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert not _unknown(spec, POD_FIELDS), _unknown(spec, POD_FIELDS)
    (container,) = spec["containers"]
    assert not _unknown(container, CONTAINER_FIELDS), _unknown(container, CONTAINER_FIELDS)
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    volumes = _mounts(container, spec["volumes"], configmaps)
    resources = container.get("resources", {})
    cri = {
        "metadata": {"name": container["name"], "attempt": 0},
        "image": {"image": container["image"]},
        "command": container.get("command", []),
        "args": container.get("args", []),
        "envs": _env(container, AGENT_POD),
        "mounts": volumes.pop("mounts"),
        "linux": {
            "resources": {
                "memoryLimitInBytes": str(_quantity(resources["limits"]["memory"])),
                "cpuShares": str(_cpu_shares(resources["requests"]["cpu"])),
            },
            "securityContext": _security(container, spec),
        },
    }
    return {"pod": AGENT_POD, "container": cri, "probes": _probes(container), **volumes}


def build_image() -> Path:
    """`make image`'s archive (cached: only a changed input rebuilds)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "image.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def image_files(archive: Path) -> set[str]:
    """The paths in the archive's image: its layers in order, whiteouts applied."""
    files: set[str] = set()
    with tarfile.open(archive) as oci:

        def blob(digest: str):
            return oci.extractfile(f"blobs/{digest.replace(':', '/')}")

        (entry,) = json.load(oci.extractfile("index.json"))["manifests"]
        for layer in json.load(blob(entry["digest"]))["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as tar:
                for member in tar:
                    head, _, base = member.name.removeprefix("./").rpartition("/")
                    if base == ".wh..wh..opq":  # an opaque directory: the lower layers' content
                        files = {f for f in files if not f.startswith(f"{head}/")}
                    elif base.startswith(".wh."):
                        gone = f"{head}/{base[4:]}".lstrip("/")
                        files = {f for f in files if f != gone and not f.startswith(gone + "/")}
                    else:
                        files.add(f"{head}/{base}".lstrip("/"))
    return files


def test_the_image_holds_the_agent_and_no_installer():
    """The Dockerfile's last stage gets the venv alone (docs/performance.md, "Image size"): the
    agent, its CO-RE objects and its dependencies, but neither pip, setuptools and wheel in the
    venv nor python3-venv's bundled wheels. Host-side: it reads the archive, no boot."""
    files = image_files(build_image())
    site = "opt/kubenpu/lib/python3.13/site-packages/"
    assert "opt/kubenpu/bin/kubenpu-agent" in files
    assert f"{site}kubenpu/kernel/objects/kubenpu-aggregate.bpf.o" in files
    for package in ("kubenpu", "grpc", "cryptography", "opentelemetry/sdk/metrics", "yaml"):
        assert f"{site}{package}/__init__.py" in files, package
    for tool in ("pip", "setuptools", "wheel"):
        assert not any(f.startswith(f"{site}{tool}/") for f in files), tool
    assert not any(f.startswith("usr/share/python-wheels/") for f in files)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return render_helm(VALUES)


@pytest.fixture(scope="module")
def agent_container(rendered) -> dict:
    (container,) = _one(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def result(tmp_path_factory, rendered) -> dict:
    out = tmp_path_factory.mktemp(f"image-{KERNEL}")
    archive = build_image()
    spec = pod_spec(rendered) | {"image_archive": archive.name}
    (out / "pod.json").write_text(json.dumps(spec, indent=1))
    try:  # the guest reads it over 9p from /out
        os.link(archive, out / archive.name)
    except OSError:
        shutil.copyfile(archive, out / archive.name)
    try:
        boot(KERNEL, "/src/tests/vm/image.sh", out)
    finally:
        (out / archive.name).unlink()
    return json.loads((out / "result.json").read_text())


def test_counts_exact_on_metrics_and_otlp(result):
    """Two containers of one pod, two devices, three kinds: exact, with the pod's labels."""
    expected = expected_counts(result["expected"])
    assert {k[:3] for k in expected} == {("team-a", "trainer-0", c) for c in ("main", "sidecar")}
    assert ioctl_counts(result["prometheus"]) == expected
    assert otlp_counts(result["otlp"]) == expected
    assert by_reason(result["prometheus"], "kubenpu_events_dropped_total") == {}


def test_the_node_has_no_kernel_headers(result):
    # what the default images of COS, AL2023, Bottlerocket and Talos lack; the counts above and
    # the attach line below are from this node
    assert result["headerless"] == {
        "usr_src": [],
        "build": False,
        "kheaders_module": [],
        "kheaders_loaded": False,
    }


def test_the_image_was_pulled_from_the_registry(result, agent_container):
    """The node got the agent's image as a cluster's node does: containerd pulled the rendered
    reference from a registry (its manifest fetched there), no archive imported."""
    assert agent_container["image"].startswith("127.0.0.1:5000/kubenpu/kubenpu-agent:")
    assert agent_container["image"] in result["images"]
    assert result["pulled"].startswith("sha256:")
    assert result["manifest_requests"] >= 1


def test_agent_ran_from_the_chart_image_with_its_args(result, agent_container):
    assert agent_container["image"] in result["images"]
    cmdline = result["process"]["cmdline"]
    assert cmdline[-len(agent_container["args"]) :] == agent_container["args"]
    # the chart's default: the CO-RE object, loaded in the agent (no headers, no LLVM)
    assert "probe attached: fentry on security_file_ioctl+" in result["agent_log"]
    assert " (core) (" in result["agent_log"]
    assert "Traceback" not in result["agent_log"]


def test_probes_answer_as_the_chart_expects(result):
    """The probe paths are the agent's health answers (200 "ok"), not a catch-all."""
    ok = {"status": 200, "body": "ok"}
    probes = {k: {**p, "body": p["body"].strip()} for k, p in result["probes"].items()}
    assert probes == {"startup": ok, "readiness": ok, "liveness": ok}


def test_process_has_the_chart_security_context(result, agent_container):
    sc = agent_container["securityContext"]
    process = result["process"]
    caps = process["caps"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    granted = sorted(sc["capabilities"]["add"])
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == granted
    assert caps["CapInh"] == caps["CapAmb"] == []
    assert process["NoNewPrivs"] == ["1" if sc["allowPrivilegeEscalation"] is False else "0"]
    assert process["Uid"] == [str(sc["runAsUser"])] * 4
    assert process["Seccomp"] == ["2"]  # a filter: the runtime's default profile
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"


def test_root_filesystem_is_read_only(result, agent_container):
    assert agent_container["securityContext"]["readOnlyRootFilesystem"] is True
    assert result["process"]["spec"]["root"]["readonly"] is True
    write = result["process"]["write_root"]
    assert write["exit_code"] != 0 and "Read-only file system" in write["stderr"]
    assert result["process"]["write_tmp"]["exit_code"] == 0  # the emptyDir


def test_mounts_and_env_reach_the_container(result, agent_container):
    """Every volumeMount of the chart is in the OCI spec containerd made, read-only as rendered."""
    oci = {m["destination"]: m for m in result["process"]["spec"]["mounts"]}
    for mount in agent_container["volumeMounts"]:
        got = oci[mount["mountPath"]]
        assert ("ro" in got["options"]) == mount.get("readOnly", False), got
    env = result["process"]["spec"]["process"]["env"]
    assert f"K8S_NODE_NAME={NODE_NAME}" in env
    assert f"OTEL_RESOURCE_ATTRIBUTES=k8s.node.name={NODE_NAME}" in env


def test_pod_spec_refuses_what_it_does_not_translate(rendered):
    """A chart field the translation does not know fails the test instead of being dropped."""
    objects = json.loads(json.dumps(rendered))
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    spec["containers"][0]["securityContext"]["runAsGroup"] = 1000
    with pytest.raises(AssertionError, match="runAsGroup"):
        pod_spec(objects)
