"""The agent with exactly the capabilities the Helm chart grants, on a real kernel in QEMU.

The guest (tests/vm/least_privilege_guest.py) runs the agent as uid 0 with every other capability
dropped from all sets, bounding included, and no_new_privs: what a container gets from
`drop: [ALL]` + `add: [...]` with allowPrivilegeEscalation: false. It must load, attach and count
exactly; without any one of the chart's capabilities it must fail with its one-line error, which
proves the set minimal. So must BPF + PERFMON alone, while the chart needs more than that (why:
daemonset.yaml). Kernel: KUBENPU_LEAST_PRIVILEGE_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from guest import boot
from helpers import by_reason, expected_counts, helm_values, ioctl_counts, otlp_counts, render_helm

KERNEL = os.environ.get("KUBENPU_LEAST_PRIVILEGE_KERNEL", "6.12")

pytestmark = pytest.mark.vm


def chart_capabilities() -> list[str]:
    """The capabilities the chart's DaemonSet adds to the agent container (after drop: ALL) for
    the probe: fdinfo's own (config.fdinfo.enabled) are measured by test_fdinfo_privilege_vm.py."""
    values = helm_values(config__fdinfo__enabled=False)
    (ds,) = (d for d in render_helm(values) if d["kind"] == "DaemonSet")
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    caps = agent["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    return sorted(caps["add"])


CHART_CAPS = chart_capabilities()
BPF_PERFMON = ["BPF", "PERFMON"]
# Sets that must not attach: one capability fewer each, and BPF + PERFMON while the chart needs
# more. fentry only: `auto` would add the kprobe attempt (refused as well, measured) and a
# second BCC compile.
REFUSED = {f"without-{c}": [k for k in CHART_CAPS if k != c] for c in CHART_CAPS}
if CHART_CAPS != BPF_PERFMON:
    REFUSED["bpf-perfmon"] = BPF_PERFMON


@pytest.fixture(scope="module")
def guest_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("least-privilege")
    plan = [{"name": "chart", "caps": CHART_CAPS, "scenario": True}]
    plan += [{"name": name, "caps": caps, "attach": "fentry"} for name, caps in REFUSED.items()]
    (out / "plan.json").write_text(json.dumps(plan))
    return boot(KERNEL, "/src/tests/vm/least_privilege.sh", out)


def _result(out: Path, name: str) -> dict:
    return json.loads((out / name / "result.json").read_text())


def _assert_only(caps: dict, granted: list[str]) -> None:
    """The agent process had `granted` and nothing else, in every set."""
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == sorted(granted)
    assert caps["CapInh"] == caps["CapAmb"] == []
    assert caps["NoNewPrivs"] == "1"


def test_agent_counts_exactly_with_chart_capabilities(guest_out):
    result = _result(guest_out, "chart")
    _assert_only(result["caps"], CHART_CAPS)
    assert "attached to drm_ioctl via fentry-module " in result["agent_log"]
    expected, prom = expected_counts(result["expected"]), result["prometheus"]
    assert ioctl_counts(prom) == expected
    assert otlp_counts(result["otlp"]) == expected
    assert by_reason(prom, "kubenpu_unattributed_calls_total") == result["expected_unattributed"]
    assert by_reason(prom, "kubenpu_events_dropped_total") == {}


@pytest.mark.parametrize("name", REFUSED)
def test_agent_fails_with_fewer_capabilities(guest_out, name):
    result = _result(guest_out, name)
    _assert_only(result["caps"], REFUSED[name])
    assert (result["rc"], result["attached"]) == (2, False)
    (error,) = result["errors"]  # one line for the operator
    assert "ERROR kubenpu: cannot attach to drm_ioctl: fentry-module: " in error
