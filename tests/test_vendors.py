"""The vendor plug-in API and the invariants the probe relies on (numbers: test_vendor_headers)."""

from __future__ import annotations

import pkgutil
import re
from itertools import takewhile
from pathlib import Path

import pytest

import kubenpu.vendors as vendors
from kubenpu.kernel.abi import DRM_COMMAND_BASE, DRM_COMMAND_END
from kubenpu.vendors import (
    Ioctl,
    Kind,
    Vendor,
    all_vendors,
    by_name,
    core,
    for_driver,
)

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {
    "amdgpu", "amdxdna", "etnaviv", "habanalabs", "i915", "ivpu", "lima", "msm", "nouveau",
    "panfrost", "panthor", "qaic", "radeon", "rocket", "v3d", "vc4", "vgem", "virtio_gpu", "xe",
}  # fmt: skip


def test_every_expected_vendor_is_a_plugin():
    assert {v.name for v in all_vendors()} == EXPECTED


def test_vendor_label_is_its_module_name():
    modules = {m.name for m in pkgutil.iter_modules(vendors.__path__) if not m.name.startswith("_")}
    assert {v.name for v in all_vendors()} == modules


def test_all_vendors_sorted_by_name():
    names = [v.name for v in all_vendors()]
    assert names == sorted(names)


@pytest.mark.parametrize(
    ("driver", "vendor"),
    [
        ("i915", "i915"),
        ("xe", "xe"),
        ("intel_vpu", "ivpu"),
        ("vc4-drm", "vc4"),
        ("faux_driver", "vgem"),
        ("virtio_gpu", "virtio_gpu"),
        ("adreno", "msm"),
    ],
)
def test_for_driver_finds_plugin(driver: str, vendor: str):
    found = for_driver(driver)
    assert found is not None and found.name == vendor


@pytest.mark.parametrize("driver", [None, "", "e1000e", "ivpu", "drm"])
def test_for_driver_unknown_is_none(driver: str | None):
    assert for_driver(driver) is None


def test_by_name():
    assert by_name("drm") is core()
    assert by_name("amdxdna") is for_driver("amdxdna")
    assert by_name("intel_vpu") is None
    assert by_name("nope") is None


def test_duplicate_nr_rejected():
    with pytest.raises(ValueError, match="duplicate ioctl nr"):
        Vendor(
            name="x",
            drivers=("x",),
            header="drm/x.h",
            ioctls=(Ioctl(0x40, Kind.SUBMIT, "A"), Ioctl(0x40, Kind.WAIT, "B")),
        )


def _driver_nr(nr: int) -> bool:
    """In the driver-private range; the kernel uses the DRM core table for every other nr."""
    return DRM_COMMAND_BASE <= nr < DRM_COMMAND_END


def test_core_table_only_core_nrs():
    assert core().name == "drm" and core().drivers == ()
    bad = [i for i in core().ioctls if _driver_nr(i.nr)]
    assert not bad, f"driver-range nr in the core table: {bad}"


@pytest.mark.parametrize("vendor", all_vendors(), ids=lambda v: v.name)
def test_vendor_table_only_driver_nrs(vendor: Vendor):
    bad = [i for i in vendor.ioctls if not _driver_nr(i.nr)]
    assert not bad, f"{vendor.name}: core-range nr in a vendor table: {bad}"


@pytest.mark.parametrize("vendor", (core(), *all_vendors()), ids=lambda v: v.name)
def test_table_entries_well_formed(vendor: Vendor):
    assert vendor.ioctls, f"{vendor.name}: empty table"
    for i in vendor.ioctls:
        assert isinstance(i.kind, Kind), f"{vendor.name}: {i.name} has kind {i.kind!r}"
        assert 0 <= i.nr <= 0xFF, f"{vendor.name}: {i.name} nr {i.nr} is not one byte"
        assert re.fullmatch(r"DRM_IOCTL_[A-Z0-9_]+", i.name), f"{vendor.name}: bad name {i.name}"
    assert re.fullmatch(r"drm/\w+\.h", vendor.header), f"{vendor.name}: bad header {vendor.header}"


@pytest.mark.parametrize("vendor", all_vendors(), ids=lambda v: v.name)
def test_vendor_counts_submissions(vendor: Vendor):
    assert any(i.kind is Kind.SUBMIT for i in vendor.ioctls), f"{vendor.name}: no submit ioctl"


def test_core_ioctls_not_repeated_in_vendor_tables():
    core_names = {i.name for i in core().ioctls}
    repeated = {(v.name, i.name) for v in all_vendors() for i in v.ioctls if i.name in core_names}
    assert not repeated


def test_vendor_names_unique():
    names = [v.name for v in (core(), *all_vendors())]
    assert len(names) == len(set(names))


def test_driver_names_unique_across_vendors():
    drivers = [d for v in all_vendors() for d in v.drivers]
    assert len(drivers) == len(set(drivers)), sorted(d for d in drivers if drivers.count(d) > 1)
    assert all(v.drivers for v in all_vendors())


# The kind each uapi name's words say, checked first to last: WAIT_CS waits, it submits nothing.
# A new plug-in whose names use another verb adds it here, after reading the driver's uapi.
_VERBS = (
    (Kind.WAIT, {"WAIT", "PREP", "THROTTLE", "DOMAIN"}),
    (Kind.SUBMIT, {"SUBMIT", "EXEC", "EXECBUFFER", "EXECBUFFER2", "EXECUTE", "CS", "PUSHBUF"}),
    (Kind.SUBMIT, {"ATTACH"}),  # vgem: attaching a fence is its only "job"
    (Kind.ALLOC, {"CREATE", "NEW", "USERPTR", "CB", "MEMORY"}),
)


def _named_kind(name: str) -> Kind | None:
    words = set(name.removeprefix("DRM_IOCTL_").split("_"))
    return next((kind for kind, verbs in _VERBS if words & verbs), None)


@pytest.mark.parametrize("vendor", (core(), *all_vendors()), ids=lambda v: v.name)
def test_each_ioctls_kind_is_what_its_uapi_name_says(vendor: Vendor):
    """Independent of docs/vendors.md (whose table is generated from the same plug-ins)."""
    wrong = {i.name: i.kind.label for i in vendor.ioctls if _named_kind(i.name) is not i.kind}
    assert not wrong, f"{vendor.name}: kind disagrees with the ioctl's name: {wrong}"


def test_kind_labels():
    assert [(k.value, k.label) for k in Kind] == [(1, "submit"), (2, "alloc"), (3, "wait")]


def _docs_rows() -> list[str]:
    """The data rows of the table under the "| vendor |" header in docs/vendors.md."""
    lines = (ROOT / "docs/vendors.md").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("| vendor |")) + 2
    return list(takewhile(lambda line: line.startswith("|"), lines[start:]))


def _expected_row(v: Vendor) -> str:
    counts = [sum(i.kind is k for i in v.ioctls) for k in Kind]
    drivers = ", ".join(f"`{d}`" for d in v.drivers) or "(all)"
    return f"| `{v.name}` | {drivers} | `{v.header}` | " + " | ".join(map(str, counts)) + " |"


def test_docs_table_matches_plugins():
    assert _docs_rows() == [_expected_row(v) for v in (core(), *all_vendors())], (
        "docs/vendors.md is out of date; regenerate its table from the plug-ins"
    )
