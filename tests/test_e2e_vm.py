"""The real-kernel end-to-end test: boots Debian kernels under QEMU and runs tests/vm/e2e_guest.py.

Everything in the guest is real: the kernel's drm_ioctl with vgem and virtio-gpu, the CO-RE object
(BCC on BCC_KERNEL), the agent,
a CRI v1 gRPC server, the Prometheus endpoint and an OTLP/gRPC receiver. Only kubelet and the
container runtime are played by the scenario (it makes the cgroups and answers CRI itself).
Kernels: KUBENPU_E2E_KERNELS (default "6.1 6.12 7.3 6.12-lockdown"); a name of tests/vm/build.sh,
or such a name + "-lockdown" to boot it with lockdown=confidentiality, where the guest also shows
that the kprobe attach mode is refused (tests/vm/lockdown.sh). On RECORDING_KERNEL the guest
also records scrapes while pods make calls, and every Grafana dashboard query is run on them by a
real Prometheus (scripts/dashboards.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from guest import boot, kernel_matrix, matrix_kernel
from helpers import (
    by_reason,
    dashboard_problems,
    dashboards,
    expected_counts,
    ioctl_counts,
    otlp_counts,
    timed_calls_mismatches,
)

KERNELS = kernel_matrix("KUBENPU_E2E_KERNELS")
RECORDING_KERNEL = "6.12"  # one kernel is enough for the dashboards: the queries run on the host
RECORD_ARG = "kubenpu.record_dashboards=1"  # tests/vm/e2e_guest.py
# The BCC fallback keeps one kernel's e2e (probe.loader: bcc); every other boot runs the CO-RE
# object under the default `auto`.
BCC_KERNEL = "6.1"

pytestmark = pytest.mark.vm


MODES = ("aggregate", "events")


class GuestRun(NamedTuple):
    out: Path
    lockdown: bool
    recorded: bool
    loader: str


@pytest.fixture(scope="module", params=KERNELS)
def guest_run(request, tmp_path_factory) -> GuestRun:
    """One boot per kernel; the guest runs the scenario once per probe mode."""
    kernel, extra = matrix_kernel(request.param)
    lockdown = bool(extra)
    script = "/src/tests/vm/lockdown.sh" if lockdown else "/src/tests/vm/e2e.sh"
    recorded = request.param == RECORDING_KERNEL
    extra += [RECORD_ARG] if recorded else []
    loader = "bcc" if request.param == BCC_KERNEL else "core"
    extra += ["kubenpu.loader=bcc"] if loader == "bcc" else []
    out = boot(kernel, script, tmp_path_factory.mktemp(f"e2e-{request.param}"), *extra)
    return GuestRun(out, lockdown, recorded, loader)


@pytest.fixture(params=MODES)
def result(request, guest_run: GuestRun) -> dict:
    return json.loads((guest_run.out / request.param / "result.json").read_text())


def test_prometheus_counts_equal_issued_calls(result):
    assert ioctl_counts(result["prometheus"]) == expected_counts(result["expected"])


def test_otlp_counts_equal_issued_calls(result):
    assert otlp_counts(result["otlp"]) == expected_counts(result["expected"])


def test_kernel_times_every_counted_call_and_counts_its_errors(result, guest_run: GuestRun):
    """CO-RE aggregate mode times calls (docs/latency.md); BCC and events mode do not."""
    if result["mode"] != "aggregate" or guest_run.loader != "core":
        assert result["durations"] == []
        return
    assert len(result["returns"]) > 5  # keys of every pod, the host, both devices and kinds
    assert timed_calls_mismatches(result["durations"], result["returns"]) == []
    timed = ioctl_counts(result["prometheus"], "kubenpu_ioctl_duration_seconds_count")
    assert timed == expected_counts(result["expected"])  # every counted call, on /metrics


def test_host_process_is_unattributed_not_dropped(result):
    prom = result["prometheus"]
    assert by_reason(prom, "kubenpu_unattributed_calls_total") == result["expected_unattributed"]
    assert by_reason(prom, "kubenpu_events_dropped_total") == {}


def test_device_info_lists_both_devices(result):
    info = result["prometheus"]["kubenpu_device_info"]
    assert sorted((s["labels"]["vendor"], s["labels"]["device"]) for s in info) == sorted(
        result["devices"].items()
    )


def test_attach_mode_is_fentry(result, guest_run: GuestRun):
    # the default probe.hook: fentry on the LSM hook, compat variant included; CO-RE under the
    # default loader, BCC where the boot asks for it
    functions = "security_file_ioctl+security_file_ioctl_compat"
    line = f"probe attached: fentry on {functions} ({guest_run.loader}), probe.mode "
    assert line in result["agent_log"]
    if guest_run.loader == "core":
        assert "falling back to BCC" not in result["agent_log"]


def test_lockdown_is_as_booted(result, guest_run: GuestRun):
    want = "[confidentiality]" if guest_run.lockdown else "[none]"
    assert want in result["lockdown"].split()


def test_kprobe_refused_under_lockdown(guest_run: GuestRun):
    if not guest_run.lockdown:
        pytest.skip("booted without lockdown")
    kprobe = json.loads((guest_run.out / "kprobe" / "result.json").read_text())
    assert "[confidentiality]" in kprobe["lockdown"].split()
    assert (kprobe["rc"], kprobe["attached"]) == (2, False)
    (error,) = kprobe["errors"]  # one line for the operator
    assert "ERROR kubenpu: cannot attach to security_file_ioctl: kprobe: " in error
    # BCC turned the probe's field reads into bpf_probe_read, which lockdown withholds.
    assert "cannot use helper bpf_probe_read" in kprobe["agent_log"]
    assert any("use of bpf to read kernel RAM" in line for line in kprobe["kernel_log"])


@pytest.fixture(scope="module")
def recording(guest_run: GuestRun) -> dict:
    if not guest_run.recorded:
        pytest.skip(f"dashboards are recorded on {RECORDING_KERNEL} only")
    return json.loads((guest_run.out / MODES[0] / "recording.json").read_text())


@pytest.fixture(scope="module")
def boards(recording: dict, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("dashboards")
    return {b.name: b for b in dashboards.run_all(dashboards.tools(), recording, work)}


def test_every_dashboard_query_returns_its_series(recording, tmp_path):
    """Each variable resolves to the recorded node and namespaces; each panel query returns the
    series the panel shows (labels, calls, zero drops and errors); the pods panel shows exactly
    the pods that called."""
    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    assert dashboard_problems(boards, recording) == []
