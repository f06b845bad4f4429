"""The capabilities the agent needs to read DRM fdinfo of other processes, measured on a real
kernel (issue 10.6). Reading /proc/PID/fd needs DAC access to the directory (owned by the
process's uid, mode 0500) and readlink/fdinfo need ptrace-read access (PTRACE_MODE_READ_FSCREDS):
another uid, or a target with capabilities the reader lacks, needs CAP_SYS_PTRACE.

The guest (tests/vm/fdinfo_privilege_guest.py) scans a uid-1000 holder and a root holder with
every capability, as uid 0 under each capability set below. The chart must grant a set that reads
both, and every set with one capability fewer must fail to. Kernel: KUBENPU_LEAST_PRIVILEGE_KERNEL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from guest import boot
from helpers import helm_values, render_helm

KERNEL = os.environ.get("KUBENPU_LEAST_PRIVILEGE_KERNEL", "6.12")

pytestmark = pytest.mark.vm


def agent_caps(**values: object) -> list[str]:
    (ds,) = (d for d in render_helm(helm_values(**values)) if d["kind"] == "DaemonSet")
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    return sorted(agent["securityContext"]["capabilities"]["add"])


CHART = agent_caps()
WITHOUT_FDINFO = agent_caps(config__fdinfo__enabled=False)
EXTRA = [c for c in CHART if c not in WITHOUT_FDINFO]
PLAN = {"chart": CHART, "without-fdinfo": WITHOUT_FDINFO} | {
    f"without-{c}": [k for k in CHART if k != c] for c in EXTRA
}


@pytest.fixture(scope="module")
def guest_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fdinfo-privilege")
    plan = [{"name": name, "caps": caps} for name, caps in PLAN.items()]
    (out / "plan.json").write_text(json.dumps(plan))
    return boot(KERNEL, "/src/tests/vm/fdinfo_privilege.sh", out)


def _read(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_the_charts_capabilities_read_every_holder(guest_out: Path) -> None:
    result = _read(guest_out, "chart")
    for who in ("uid1000", "root"):
        assert result[who]["drm_fds"] == 1, result
        assert "unreadable" not in result[who]["skipped"], result


@pytest.mark.parametrize("name", [n for n in PLAN if n != "chart"])
def test_one_capability_fewer_cannot_read_them_all(guest_out: Path, name: str) -> None:
    result = _read(guest_out, name)
    assert any(result[who]["skipped"].get("unreadable") for who in ("uid1000", "root")), result
