"""Every Grafana dashboard query, run by a real Prometheus on a real agent's recorded scrapes.

tests/testdata/dashboards-recording.json is the recording the VM e2e made on 6.12 (see
docs/dashboards.md): the agent on a real kernel while pods and a host process made calls. This
runs without a VM, so a dashboard edit that breaks a query fails here in the unit run;
tests/test_e2e_vm.py runs the same check on a fresh recording.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import dashboard_problems, dashboards

pytestmark = pytest.mark.tools

RECORDING = Path(__file__).parent / "testdata" / "dashboards-recording.json"


def test_every_dashboard_query_returns_its_series(tmp_path):
    recording = json.loads(RECORDING.read_text())
    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    assert dashboard_problems(boards, recording) == []


def test_a_broken_query_is_reported(tmp_path, monkeypatch):
    """The check can fail: a panel naming a label the agent does not export shows up."""
    recording = json.loads(RECORDING.read_text())
    real = dashboards.boards

    def broken() -> dict:
        boards = real()
        target = boards["kubenpu-pods"]["panels"][0]["targets"][0]
        target["expr"] = target["expr"].replace("(namespace, pod, kind)", "(namespace, pod, knd)")
        return boards

    monkeypatch.setattr(dashboards, "boards", broken)
    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    problems = dashboard_problems(boards, recording)
    assert problems and all("Calls per second by pod and kind" in p for p in problems), problems
