"""The release (`make release`, scripts/release.sh), installed as a user installs it.

- The wheel, installed into a fresh venv with its agent extras, finds both CO-RE objects.
- A real OCI registry (Debian's docker-registry, scripts/registry-tools.sh) on a free local port
  gets the image (skopeo, from the release's OCI archive) and the chart (`helm push`); then
  `helm template` and `helm install --dry-run` from oci://127.0.0.1:PORT/charts/kubenpu render
  the DaemonSet with the image the registry holds, by tag and by its digest.
Needs root (the image build: buildah, as scripts/image.sh says) and the Debian packages the scripts
install; the image build takes minutes the first time, then is cached.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, k8s_tools, script_output

pytestmark = pytest.mark.tools
VERSION = "0.1.0"
REPOSITORY = "kubenpu/kubenpu-agent"  # the chart's image.repository, under the registry's host
OBJECTS = {f"kubenpu/kernel/objects/kubenpu-{m}.bpf.o" for m in ("aggregate", "events", "jobs")}


def sh(*args: str | Path, timeout: float = 300, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        list(map(str, args)), capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def release() -> Path:
    return Path(script_output("release.sh", timeout=3600))


def test_release_has_the_three_artifacts(release: Path) -> None:
    names = sorted(p.name for p in release.iterdir())
    assert names == [
        "SHA256SUMS",
        f"kubenpu-{VERSION}-py3-none-any.whl",
        f"kubenpu-{VERSION}.tgz",
        f"kubenpu-agent-{VERSION}.oci.tar",
    ]
    proc = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=release, capture_output=True)
    assert proc.returncode == 0, proc.stdout
    for path in sorted(release.iterdir()):
        print(f"{path.name}: {path.stat().st_size:,} bytes")


def test_the_wheel_installs_an_agent_that_finds_both_objects(release: Path, tmp_path) -> None:
    wheel = release / f"kubenpu-{VERSION}-py3-none-any.whl"
    assert set(zipfile.ZipFile(wheel).namelist()) >= OBJECTS
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    sh(python, "-m", "pip", "install", "-q", f"{wheel}[agent]", timeout=900)
    check = (
        "import hashlib, kubenpu.kernel.core as c;"
        "print(*(hashlib.sha256(c.object_path(m).read_bytes()).hexdigest() for m in (1, 0)))"
    )
    # outside the checkout, so that `import kubenpu` can only find the installed wheel
    found = sh(python, "-c", check, cwd=tmp_path).split()
    built = [
        sh("sha256sum", ROOT / "kubenpu" / "kernel" / "objects" / f"kubenpu-{m}.bpf.o").split()[0]
        for m in ("aggregate", "events")
    ]
    assert found == built
    assert sh(env_dir / "bin" / "kubenpu-agent", "--version", cwd=tmp_path).strip() == VERSION
    # the installed package is the wheel's, not this checkout
    where = sh(python, "-c", "import kubenpu; print(kubenpu.__file__)", cwd=tmp_path)
    assert where.startswith(str(env_dir)), where


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    """docker-registry on 127.0.0.1:PORT, storage in a scratch directory, plain HTTP."""
    binary = script_output("registry-tools.sh")
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = {
        "version": 0.1,
        "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    (work / "config.yml").write_text(yaml.safe_dump(config))
    log = (work / "registry.log").open("w")
    server = subprocess.Popen([binary, "serve", str(work / "config.yml")], stdout=log, stderr=log)
    host = f"127.0.0.1:{port}"
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, (work / "registry.log").read_text()
            time.sleep(0.1)
        yield host
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def pushed(release: Path, registry: str) -> dict[str, str]:
    """The image and the chart in the registry; the image's digest as the registry has it."""
    image = f"{registry}/{REPOSITORY}:{VERSION}"
    sh(
        "skopeo", "copy", "--quiet", "--dest-tls-verify=false",
        f"oci-archive:{release / f'kubenpu-agent-{VERSION}.oci.tar'}", f"docker://{image}",
        timeout=600,
    )  # fmt: skip
    helm = k8s_tools() / "helm"
    sh(helm, "push", release / f"kubenpu-{VERSION}.tgz", f"oci://{registry}/charts", "--plain-http")
    inspect = json.loads(sh("skopeo", "inspect", "--tls-verify=false", f"docker://{image}"))
    return {
        "image": image,
        "digest": inspect["Digest"],
        "chart": f"oci://{registry}/charts/kubenpu",
    }


def render(pushed: dict[str, str], registry: str, *extra: str) -> dict:
    helm = k8s_tools() / "helm"
    args = [
        "--version", VERSION, "--plain-http", "-n", "kubenpu",
        "--set", f"image.repository={registry}/{REPOSITORY}", *extra,
    ]  # fmt: skip
    docs = [
        d for d in yaml.safe_load_all(sh(helm, "template", "kubenpu", pushed["chart"], *args)) if d
    ]
    (ds,) = (d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "kubenpu")
    dry = sh(helm, "install", "kubenpu", pushed["chart"], *args, "--dry-run")
    assert "STATUS: pending-install" in dry and "kubectl -n kubenpu rollout status" in dry
    return ds


def test_the_chart_from_the_registry_renders_the_registrys_image(pushed, registry) -> None:
    ds = render(pushed, registry)
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    assert agent["image"] == pushed["image"]
    # the reference the chart renders is one the registry serves
    sh("skopeo", "inspect", "--tls-verify=false", f"docker://{agent['image']}")


def test_the_chart_pins_the_registrys_digest(pushed, registry) -> None:
    ds = render(pushed, registry, "--set", f"image.digest={pushed['digest']}")
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    assert agent["image"] == f"{pushed['image']}@{pushed['digest']}"
    by_digest = f"docker://{registry}/{REPOSITORY}@{pushed['digest']}"
    found = json.loads(sh("skopeo", "inspect", "--tls-verify=false", by_digest))
    assert found["Digest"] == pushed["digest"]
    assert found["Os"] == "linux"
