"""Boot the QEMU guest for a test: tests/vm/run.sh, with a clear failure message."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def boot(kernel: str, script: str, out: Path, *kernel_args: str) -> Path:
    """Run the guest script (a /src path) on `kernel`; returns `out`, where it wrote its results."""
    extra = ["--", *kernel_args] if kernel_args else []
    proc = subprocess.run(
        [str(ROOT / "tests/vm/run.sh"), kernel, script, str(out), *extra], check=False
    )
    assert proc.returncode == 0, f"guest run of {script} failed on {kernel}; see {out}/console.log"
    return out
