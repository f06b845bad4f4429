"""docs/drivers.md is what scripts/drivers.py writes from the code's tables, and its columns
follow those tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kubenpu import vendors

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "drivers.md"


def test_the_committed_matrix_is_the_generated_one(tmp_path: Path) -> None:
    out = tmp_path / "drivers.md"
    subprocess.run([sys.executable, ROOT / "scripts" / "drivers.py", out], check=True, timeout=120)
    assert out.read_text() == PAGE.read_text(), "run scripts/drivers.py and commit docs/drivers.md"


def rows() -> dict[str, dict[str, str]]:
    lines = [line for line in PAGE.read_text().splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    table = [
        dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in lines[1:]
    ]
    return {
        r["vendor"].strip("`") + (r["sysfs drivers"] if r["vendor"] == "-" else ""): r
        for r in table
    }


def test_every_vendor_plugin_has_a_row_with_its_counts() -> None:
    found = rows()
    for vendor in vendors.all_vendors():
        kinds = [i.kind for i in vendor.ioctls]
        assert found[vendor.name]["calls"] == " / ".join(str(kinds.count(k)) for k in vendors.Kind)


def test_columns_hold_what_the_recorded_trees_give() -> None:
    """Spot checks against what docs/fdinfo.md and docs/metrics.md say of these drivers."""
    found = rows()
    assert found["xe"]["fdinfo time"] == "cycles" and found["i915"]["fdinfo time"] == "ns"
    assert found["xe"]["energy"] == "counter" and found["xe"]["power"] == "from energy"
    assert found["amdgpu"]["power"] == "hwmon" and found["amdgpu"]["allocation mapping"].startswith(
        "amd-gpu, "
    )
    assert found["habanalabs"]["allocation mapping"] == "habana"
    assert found["ivpu"]["allocation mapping"] == "intel-npu"
    assert found["-`nvidia`"]["calls"] == "not counted"
