"""Agent restarts with the probe pinned in bpffs, on a real kernel in QEMU (docs/pinning.md).

The guest (tests/vm/restart_guest.py) runs a paced load across a SIGKILL of the agent and a
restart that adopts the pinned probe, then across an upgrade (another program) that hands over,
then uninstalls. Start times and RSS are recorded in result.json and printed, not asserted.
Kernel: KUBENPU_RESTART_KERNEL (default 6.12).
"""

from __future__ import annotations

import json
import os

import pytest
from guest import boot

KERNEL = os.environ.get("KUBENPU_RESTART_KERNEL", "6.12")

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = boot(KERNEL, "/src/tests/vm/restart.sh", tmp_path_factory.mktemp("restart"))
    found = json.loads((out / "result.json").read_text())
    for start in ("cold", "adopt", "upgrade", "readopt"):
        print(start, {k: v for k, v in found[start].items() if k != "dropped"})
    return found


def test_probe_outlives_a_killed_agent(result):
    (pinned,) = result["pins"]["after_cold"].values()
    assert pinned == ["counts", "devices", "events", "ioctls", "link", "lost", "meta"]
    assert result["programs_after_kill"], "nothing of ours attached once the agent was killed"


def test_restart_adopts_and_loses_no_call_across_a_kill(result):
    assert "adopted the pinned probe" in result["logs"]["adopt"]
    assert "attached to drm_ioctl via fentry-module (adopted" in result["logs"]["adopt"]
    assert result["restart"]["counted"] == result["restart"]["issued"]


def test_adopting_agent_has_no_bcc_in_memory(result):
    assert result["cold"]["libbcc"] and not result["adopt"]["libbcc"]


def test_upgrade_hands_over_and_keeps_the_totals(result):
    upgrade = result["upgrade"]
    assert "took over the totals of the retired probe" in result["logs"]["upgrade"]
    (old,) = result["pins"]["after_cold"]
    after = result["pins"]["after_upgrade"]
    assert "link" not in after.pop(old), "the old probe is still attached"
    (pinned,) = after.values()
    assert "link" in pinned
    # The calls between the old probe's detach and the new one's attach are not counted.
    assert 0 <= upgrade["issued"] - upgrade["counted"] < 0.01 * upgrade["issued"]
    assert not [d for d in upgrade["dropped"] if d["value"]]


def test_a_restart_after_the_upgrade_keeps_the_retired_totals(result):
    assert "adopted the pinned probe" in result["logs"]["readopt"]
    assert result["readopt"]["counted"] == result["upgrade"]["counted"]


def test_uninstall_leaves_nothing_attached(result):
    assert result["uninstall"]["rc"] == 0, result["uninstall"]["output"]
    assert result["programs_before_uninstall"], "the pinned probe did not survive the stop"
    assert result["programs_after_uninstall"] == []
    assert not result["pin_dir_exists"]
