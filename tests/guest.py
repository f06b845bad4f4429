"""Boot the QEMU guest for a test: tests/vm/run.sh, with a clear failure message."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LOCKDOWN = "-lockdown"  # a matrix entry <kernel>-lockdown boots <kernel> under lockdown


def kernel_matrix(variable: str) -> list[str]:
    """The kernels a VM test module boots: $variable, else each of tests/vm/build.sh and one
    under lockdown (the Makefile's KERNELS)."""
    return os.environ.get(variable, "6.1 6.12 7.3 6.12-lockdown").split()


def matrix_kernel(entry: str) -> tuple[str, list[str]]:
    """A matrix entry's kernel, and the kernel arguments it boots with (lockdown's, or none)."""
    kernel = entry.removesuffix(_LOCKDOWN)
    return kernel, ["lockdown=confidentiality"] if kernel != entry else []


def boot(kernel: str, script: str, out: Path, *kernel_args: str) -> Path:
    """Run the guest script (a /src path) on `kernel`; returns `out`, where it wrote its results."""
    extra = ["--", *kernel_args] if kernel_args else []
    proc = subprocess.run(
        [str(ROOT / "tests/vm/run.sh"), kernel, script, str(out), *extra], check=False
    )
    assert proc.returncode == 0, f"guest run of {script} failed on {kernel}; see {out}/console.log"
    return out
