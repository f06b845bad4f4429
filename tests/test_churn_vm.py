"""Pod churn on a real containerd node: boots one kernel and runs tests/vm/churn_guest.py.

Both probe modes: one-call containers whose cgroup is removed right after their call, and a
containerd restart while pods make calls. Every call must be counted under its own pod.
Kernels: KUBENPU_CHURN_KERNELS (space-separated, default "6.12"); extra kernel arguments for every
boot in KUBENPU_CHURN_ARGS (e.g. lockdown=confidentiality).
"""

from __future__ import annotations

import json
import os

import pytest
from guest import boot
from helpers import by_reason, expected_counts, ioctl_counts

KERNELS = os.environ.get("KUBENPU_CHURN_KERNELS", "6.12").split()
ARGS = os.environ.get("KUBENPU_CHURN_ARGS", "").split()
MODES = ("aggregate", "events")

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module", params=KERNELS)
def result(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"churn-{request.param}")
    boot(request.param, "/src/tests/vm/churn.sh", out, *ARGS)
    return json.loads((out / "result.json").read_text())


def _pod_counts(run: dict, scenario: str, counts: dict[tuple, float]) -> dict[tuple, float]:
    pod = tuple(run[scenario]["pod"])
    return {k: v for k, v in counts.items() if k[:2] == pod}


@pytest.mark.parametrize("mode", MODES)
def test_births_are_reported(result, mode):
    """The cgroup_mkdir program loaded (also under lockdown=confidentiality when asked for)."""
    assert "cgroup births unavailable" not in result["modes"][mode]["agent_log"]
    for arg in ARGS:
        if arg.startswith("lockdown="):
            assert f"[{arg.partition('=')[2]}]" in result["lockdown"]


@pytest.mark.parametrize("mode", MODES)
def test_one_call_containers_keep_their_pod(result, mode):
    """Each container made one call and was gone at once (its cgroup removed by the runtime)."""
    run = result["modes"][mode]
    assert run["oneshot"]["cgroups_removed"] == result["oneshots"]
    expected = expected_counts(run["expected"])
    got = _pod_counts(run, "oneshot", ioctl_counts(run["scrape"]))
    assert got == _pod_counts(run, "oneshot", expected)
    assert len(got) == result["oneshots"]
    assert "not_indexed" not in by_reason(run["scrape"], "kubenpu_unattributed_calls_total")


@pytest.mark.parametrize("mode", MODES)
def test_containerd_restart_loses_no_attribution(result, mode):
    """Calls made while containerd was down end up on their pod once it is back."""
    run = result["modes"][mode]
    expected = expected_counts(run["expected"])
    got = ioctl_counts(run["scrape"])
    # The whole scrape, not the pod's part: calls counted anywhere else show in the diff.
    assert got == expected, run["agent_log"]
    assert by_reason(run["scrape"], "kubenpu_unattributed_calls_total") == {}
