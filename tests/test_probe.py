"""Host-side checks of the probe's plumbing. Loading and attaching run in the VM (test_e2e_vm)."""

import re

import pytest

from kubenpu import vendors
from kubenpu.events import KERNEL_LOST
from kubenpu.probe import AttachPlan, attach_plans, source_text, vendor_ids


def test_module_drm_uses_module_kfunc_then_kprobe(tmp_path):
    (tmp_path / "drm").touch()
    plans = attach_plans("auto", tmp_path)
    assert [p.attach for p in plans] == ["fentry-module", "kprobe"]
    assert plans[0].header.startswith("MODULE_KFUNC_PROBE(drm, drm_ioctl,")
    assert plans[0].fn_name == "kfunc__drm__drm_ioctl"


def test_builtin_drm_uses_kfunc(tmp_path):
    assert [p.attach for p in attach_plans("fentry", tmp_path)] == ["fentry"]
    assert attach_plans("auto", tmp_path)[0].fn_name == "kfunc__vmlinux__drm_ioctl"


def test_kprobe_only_when_asked(tmp_path):
    assert [p.attach for p in attach_plans("kprobe", tmp_path)] == ["kprobe"]


@pytest.mark.parametrize("plan", attach_plans("auto") + attach_plans("fentry"))
def test_source_has_no_placeholders_left(plan: AttachPlan):
    text = source_text(plan, ringbuf_pages=64, counts_entries=1024)
    assert plan.header in text
    assert not re.search(r"\b(KUBENPU_ATTACH|RINGBUF_PAGES|COUNTS_ENTRIES)\b", text)


def test_vendor_ids_reserve_zero_for_the_core_table():
    ids = vendor_ids()
    assert ids[vendors.core().name] == 0
    assert sorted(ids.values()) == list(range(len(vendors.all_vendors()) + 1))


def test_kind_values_match_the_c_side():
    # bpf/kubenpu.bpf.c documents 1 submit, 2 alloc, 3 wait in the `ioctls` map comment.
    text = source_text(attach_plans("kprobe")[0], 64, 1024)
    assert "1 submit, 2 alloc, 3 wait" in text
    assert [k.value for k in vendors.Kind] == [1, 2, 3]


def test_lost_slots_match_the_c_side():
    text = source_text(attach_plans("kprobe")[0], 64, 1024)
    slots = {name.lower(): int(i) for name, i in re.findall(r"#define LOST_(\w+) (\d+)", text)}
    assert slots == {name: i for i, name in enumerate(KERNEL_LOST)}
    assert f"BPF_PERCPU_ARRAY(lost, u64, {len(KERNEL_LOST)});" in text
