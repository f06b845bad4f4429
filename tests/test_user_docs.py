"""The docs for users say what the chart and the code do: the README's install line renders,
the Pod Security level it names is the one the chart's pod needs, every chart value the pages
quote exists, every link resolves, and every alert has one spelling."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import CHART, helm_values, render_helm, script

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
chart_readme = script("chart_readme")
PAGES = [ROOT / "docs" / n for n in ("troubleshooting.md", "faq.md", "upgrade.md", "drivers.md")]
PRIVILEGED = "pod-security.kubernetes.io/enforce=privileged"
# Pod Security "baseline" (kubernetes.io/docs/concepts/security/pod-security-standards): the
# capabilities a container may add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def baseline_violations(pod: dict[str, Any]) -> set[str]:
    """What of Pod Security's baseline level the pod spec breaks (the checks that apply here)."""
    found = {f"hostPath {v['hostPath']['path']}" for v in pod.get("volumes", []) if "hostPath" in v}
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        added = set(sc.get("capabilities", {}).get("add", []))
        found |= {f"capability {cap}" for cap in added - BASELINE_CAPABILITIES}
        if sc.get("privileged"):
            found.add("privileged")
    if pod.get("hostPID") or pod.get("hostNetwork") or pod.get("hostIPC"):
        found.add("host namespaces")
    return found


def test_the_chart_needs_the_privileged_pod_security_level_and_the_docs_say_so():
    docs = render_helm(hooks=True)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "DaemonSet"]
    assert len(pods) == 2
    agent = baseline_violations(pods[0])
    assert "privileged" not in agent and "host namespaces" not in agent
    assert {"capability BPF", "capability PERFMON", "hostPath /sys"} <= agent
    assert all(baseline_violations(p) for p in pods), "the uninstall hook mounts bpffs too"
    assert baseline_violations({"containers": [{}]}) == set()  # the check can pass
    readme = README.read_text()
    assert PRIVILEGED in readme
    assert (
        PRIVILEGED.replace("=", ": ") in (ROOT / "deploy/kustomize/base/namespace.yaml").read_text()
    )


def readme_install() -> list[list[str]]:
    """The README's install commands, as argv lists."""
    text = README.read_text()
    section = text[text.index("## Install on a cluster") : text.index("## The two commands")]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(part) for line in block.splitlines() for part in line.split("&&")]


def test_the_readme_opens_with_the_install_and_keeps_the_two_commands():
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Install on a cluster", "The two commands"]
    opening = text[: text.index("## How it is tested")]
    assert not re.search(r"\d[\d,]* tests|from a fresh clone", opening), "statistics up front"
    for line in (
        "make demo   # a QEMU guest with virtual GPUs: the agent and sample pods, then kubenpuctl "
        "devices and top",
        "make test   # lint, unit tests against real receivers and tools, and the real-kernel "
        "tests in QEMU",
    ):
        assert line in text


def test_the_readme_install_line_renders_the_registrys_image_and_the_otlp_endpoint():
    (create, label, install) = readme_install()
    assert create[:3] == ["kubectl", "create", "namespace"] and label[-1] == PRIVILEGED
    assert install[:3] == ["helm", "install", "kubenpu"]
    assert install[3] == "oci://REGISTRY/charts/kubenpu" and install[4:6] == ["--version", "0.1.0"]
    values: dict[str, Any] = {}
    sets = [install[i + 1] for i, arg in enumerate(install) if arg == "--set"]
    for item in sets:
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = True if value == "true" else value
    docs = {d["kind"]: d for d in render_helm(values)}
    (agent,) = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert agent["image"] == "REGISTRY/kubenpu-agent:0.1.0"
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    assert config["export"]["otlp"]["enabled"] is True
    assert config["export"]["otlp"]["endpoint"] == "http://otel-collector.monitoring:4317"


QUOTED = re.compile(r"`([A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`")


def resolves(tree: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_quoted_chart_value_exists(page: Path):
    values = helm_values()
    quoted = {q for q in QUOTED.findall(page.read_text()) if q.split(".")[0] in values}
    missing = {q for q in quoted if not resolves(values, q.split("."))}
    assert not missing, f"{page.name} quotes chart values that do not exist: {missing}"


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_link_resolves(page: Path):
    for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
        if target.startswith("http"):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.name} links to {target}"
        if anchor:
            assert anchor in anchors(path), f"{page.name} links to a missing anchor: {target}"


STARTUP_CAUSES = [
    "No capabilities",
    "Refused with every capability",
    "drm.ko has no BTF",
    "No BTF",
    "Lockdown",
    "The CO-RE object is missing",
    "The CO-RE object is corrupt",
    "Old libbpf",
]


def test_troubleshooting_has_every_startup_cause_with_a_fix():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    sections = dict(re.findall(r"^### ([^\n]+)\n(.*?)(?=^##|\Z)", text, re.M | re.S))
    assert list(sections)[: len(STARTUP_CAUSES)] == STARTUP_CAUSES
    for cause in STARTUP_CAUSES:
        assert "Fix" in sections[cause], cause
    assert "failed to find valid kernel BTF" in sections["No BTF"]  # libbpf's own words
    assert "probe.bccFallback" not in text  # the chart value is top-level bccFallback
    assert "helm show readme" in (CHART / "templates" / "NOTES.txt").read_text()


def test_the_charts_readme_is_generated_from_the_docs():
    """`helm show readme` of the chart from a registry was empty: the install section and
    troubleshooting.md now ship in it, generated (scripts/chart_readme.py) so it cannot go stale."""
    assert (CHART / "README.md").read_text() == chart_readme.render()
    install = chart_readme.render().split("## Troubleshooting")[0]
    assert "the Troubleshooting section below lists each start-up" in install


def test_the_notes_and_the_charts_readme_name_no_page_a_chart_user_lacks():
    """A chart pulled from a registry has no docs/: NOTES.txt once sent its user there."""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert re.findall(r"docs/\S+", notes) == []
    readme = chart_readme.render()
    assert [link for link in re.findall(r"\]\(([^)]+)\)", readme) if "://" not in link] == []


ALERT_LIKE = re.compile(r"\b[Kk]ube[Nn][Pp][Uu][A-Z][A-Za-z]+")


def test_every_alert_has_one_spelling():
    rules = yaml.safe_load((CHART / "files" / "rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 7
    texts = [README, *(ROOT / "docs").glob("*.md"), *(ROOT / "deploy").rglob("*.y*ml")]
    texts += [*(ROOT / "deploy").rglob("*.json"), *(ROOT / "tests").glob("*.py")]
    for path in texts:
        if path == Path(__file__):
            continue
        odd = {t for t in ALERT_LIKE.findall(path.read_text()) if t not in alerts}
        assert not odd, f"{path.relative_to(ROOT)}: {odd} is not an alert's name"
    listed = (ROOT / "docs" / "deploy.md").read_text()
    assert {a for a in alerts if f"`{a}`" not in listed} == set(), "docs/deploy.md lists them all"
