"""The real-kernel end-to-end test: boots Debian kernels under QEMU and runs tests/vm/e2e_guest.py.

Everything in the guest is real: the kernel's drm_ioctl with vgem and virtio-gpu, BCC, the agent,
a CRI v1 gRPC server, the Prometheus endpoint and an OTLP/gRPC receiver. Only kubelet and the
container runtime are played by the scenario (it makes the cgroups and answers CRI itself).
Kernels: KUBENPU_E2E_KERNELS (default "6.1 6.12").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = os.environ.get("KUBENPU_E2E_KERNELS", "6.1 6.12").split()
LABELS = ("namespace", "pod", "container", "device", "vendor", "kind")

pytestmark = pytest.mark.vm


MODES = ("aggregate", "events")


@pytest.fixture(scope="module", params=KERNELS)
def guest_run(request, tmp_path_factory) -> Path:
    """One boot per kernel; the guest runs the scenario once per probe mode."""
    out = tmp_path_factory.mktemp(f"e2e-{request.param}")
    proc = subprocess.run(
        [str(ROOT / "tests/vm/run.sh"), request.param, "/src/tests/vm/e2e.sh", str(out)],
        check=False,
    )
    assert proc.returncode == 0, f"guest run failed on {request.param}; see {out}/console.log"
    return out


@pytest.fixture(params=MODES)
def result(request, guest_run: Path) -> dict:
    return json.loads((guest_run / request.param / "result.json").read_text())


def _prom_counts(result: dict) -> dict[tuple, float]:
    return {
        tuple(s["labels"][k] for k in LABELS): s["value"]
        for s in result["prometheus"].get("kubenpu_ioctl_total", [])
    }


def _otlp_counts(result: dict) -> dict[tuple, float]:
    return {tuple(p["attributes"][k] for k in LABELS): p["value"] for p in result["otlp"]}


def _expected(result: dict) -> dict[tuple, float]:
    return {tuple(e["labels"]): e["value"] for e in result["expected"]}


def test_prometheus_counts_equal_issued_calls(result):
    assert _prom_counts(result) == _expected(result)


def test_otlp_counts_equal_issued_calls(result):
    assert _otlp_counts(result) == _expected(result)


def _nonzero(result: dict, metric: str) -> dict[str, float]:
    samples = result["prometheus"].get(metric, [])
    return {s["labels"]["reason"]: s["value"] for s in samples if s["value"]}


def test_host_process_is_unattributed_not_dropped(result):
    assert _nonzero(result, "kubenpu_unattributed_calls_total") == result["expected_unattributed"]
    assert _nonzero(result, "kubenpu_events_dropped_total") == {}


def test_device_info_lists_both_devices(result):
    info = result["prometheus"]["kubenpu_device_info"]
    assert sorted((s["labels"]["vendor"], s["labels"]["device"]) for s in info) == sorted(
        result["devices"].items()
    )


def test_attach_mode_is_fentry(result):
    assert "attached to drm_ioctl (mode fentry-module," in result["agent_log"]
