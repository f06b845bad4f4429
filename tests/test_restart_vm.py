"""Agent restarts with the probe pinned in bpffs, on a real kernel in QEMU (docs/pinning.md).

The guest (tests/vm/restart_guest.py) runs a paced load across a SIGKILL of the agent and a
restart that adopts the pinned probe, across an upgrade (another program) that hands over,
across a crash inside a hand-over (to another probe.hook), then uninstalls. Every agent runs
with the chart's capabilities for its hook and the chart's probe.pin_dir. Start times and RSS are
recorded in result.json and printed, not asserted. Kernel: KUBENPU_RESTART_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os

import pytest
from guest import boot
from helpers import chart_capabilities, helm_values, uninstall_hook

KERNEL = os.environ.get("KUBENPU_RESTART_KERNEL", "6.12")
HOOKS = ("security_file_ioctl", "drm_ioctl")
PIN_DIR = helm_values()["config"]["probe"]["pin_dir"]
LINKS = ["link-cgroup_mkdir", "link-security_file_ioctl", "link-security_file_ioctl_compat"]

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("restart")
    plan = {
        "pin_dir": PIN_DIR,
        "caps": {hook: chart_capabilities(hook) for hook in HOOKS},
        "uninstall": uninstall_hook(),
    }
    (out / "plan.json").write_text(json.dumps(plan))
    found = json.loads((boot(KERNEL, "/src/tests/vm/restart.sh", out) / "result.json").read_text())
    for start in ("cold", "adopt", "upgrade", "readopt", "after_crash"):
        print(start, found[start])
    return found


def attached(pinned: list[str]) -> bool:
    return any(name.startswith("link-") for name in pinned)


def test_probe_outlives_a_killed_agent(result):
    (pinned,) = result["pins"]["after_cold"].values()
    maps = ["counts", "devices", "events", "gate", "ioctls", "lost", "meta", "minors"]
    assert pinned == sorted(maps + LINKS)
    assert result["programs_after_kill"], "nothing of ours attached once the agent was killed"


def test_cold_start_loads_in_a_child_and_keeps_bcc_out_of_the_agent(result):
    assert "(loaded by a child process, pinned in " in result["logs"]["cold"]
    assert not result["cold"]["libbcc"] and not result["adopt"]["libbcc"]


def test_restart_adopts_and_loses_no_call_across_a_kill(result):
    assert "adopted the pinned probe" in result["logs"]["adopt"]
    functions = "security_file_ioctl+security_file_ioctl_compat"
    assert f"probe attached: fentry on {functions} (bcc) (adopted from " in result["logs"]["adopt"]
    assert "births unavailable" not in result["logs"]["adopt"]
    assert result["restart"]["counted"] == result["restart"]["issued"]


def test_upgrade_hands_over_and_accounts_for_every_call(result):
    upgrade = result["upgrade"]
    assert "handed over from the pinned probe" in result["logs"]["upgrade"]
    # from the BCC probe to the CO-RE object, loaded in the agent's process (libbpf, no LLVM)
    assert "(core) (pinned in " in result["logs"]["upgrade"]
    assert not result["upgrade"]["libbcc"]
    assert "took over the totals of the retired probe" in result["logs"]["upgrade"]
    (old,) = result["pins"]["after_cold"]
    after = result["pins"]["after_upgrade"]
    assert not attached(after.pop(old)), "the old probe is still attached"
    (pinned,) = after.values()
    assert attached(pinned)
    # Never counted twice; a call missed in the hand-over window is a handover drop.
    assert upgrade["counted"] <= upgrade["issued"] <= upgrade["counted"] + upgrade["handover"]


def test_a_restart_after_the_upgrade_keeps_the_retired_totals(result):
    assert "adopted the pinned probe" in result["logs"]["readopt"]
    assert result["readopt"]["counted"] == result["upgrade"]["counted"]


def test_a_crash_inside_a_hand_over_is_finished_by_the_next_start(result):
    crash = result["after_crash"]
    # from the CO-RE probe back to a BCC one: the hand-over works both ways
    line = "probe attached: fentry-module on drm_ioctl (bcc) (adopted from "
    assert line in result["logs"]["after_crash"]
    after = result["pins"]["after_crash"]
    assert [name for name, pinned in after.items() if attached(pinned)] == [
        result["pins"]["crashed"]
    ], "one program counts"
    assert crash["handover"] > 0, "the calls made in the cut window are not reported"
    assert crash["counted"] <= crash["issued"] <= crash["counted"] + crash["handover"]


def test_uninstall_leaves_nothing_attached(result):
    """After the uninstall hook's command: no pin directory, no program, no link of ours."""
    assert result["uninstall"]["rc"] == 0, result["uninstall"]["output"]
    assert result["uninstall"]["output"].startswith("kubenpu-agent: removed ")
    assert result["programs_before_uninstall"], "the pinned probe did not survive the stop"
    assert result["links_before_uninstall"], "no pinned link survived the stop"
    assert result["links_after_uninstall"] == []
    again = result["uninstall_again"]
    assert again == {"rc": 0, "output": f"kubenpu-agent: nothing pinned in {PIN_DIR}\n"}
    assert result["programs_after_uninstall"] == []
    assert not result["pin_dir_exists"]
