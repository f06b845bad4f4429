"""Every ioctl number in the vendor tables, checked against the kernel's own uapi headers.

One generated C file includes every header the tables name and prints _IOC_NR and _IOC_TYPE of
each macro; gcc compiles it once. A macro the headers lack shows up as a gcc "undeclared" error,
which is turned into a failure of that ioctl's test alone.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from helpers import script_output

from kubenpu.kernel.abi import DRM_IOCTL_TYPE
from kubenpu.vendors import Ioctl, Vendor, all_vendors, core

ROOT = Path(__file__).resolve().parents[1]
TABLES = (core(), *all_vendors())
CASES = [(v, i) for v in TABLES for i in v.ioctls]
UNDECLARED = re.compile(r"'(\w+)' undeclared")

pytestmark = pytest.mark.tools


def read_ioctl_numbers(
    include: Path, headers: Iterable[str], names: Iterable[str], workdir: Path
) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """(nr, type) of each named ioctl macro, and the names the headers do not define."""
    headers, names, missing = sorted(set(headers)), sorted(set(names)), set()
    while True:
        proc = _compile(include, headers, names, workdir)
        if proc.returncode == 0:
            break
        undeclared = set(UNDECLARED.findall(proc.stderr)) & set(names)
        if not undeclared:
            pytest.fail(f"gcc failed on the uapi headers:\n{proc.stderr}")
        missing |= undeclared
        names = [n for n in names if n not in undeclared]
    out = subprocess.run([workdir / "ioctls"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        name, nr, typ = line.split()
        found[name] = (int(nr), int(typ))
    return found, missing


def _compile(
    include: Path, headers: list[str], names: list[str], workdir: Path
) -> subprocess.CompletedProcess[str]:
    lines = ["#include <stdio.h>", *(f"#include <{h}>" for h in headers)]
    lines.append("int main(void) {")
    # Casts: panthor's ioctls are enum constants, whose type is not unsigned long.
    lines += [
        f'printf("{n} %lu %lu\\n", (unsigned long)_IOC_NR({n}), (unsigned long)_IOC_TYPE({n}));'
        for n in names
    ]
    lines += ["return 0;", "}"]
    src = workdir / "ioctls.c"
    src.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        ["gcc", *_include_flags(include), "-o", str(workdir / "ioctls"), str(src)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "LC_ALL": "C"},  # plain quotes around names in gcc's messages
    )


def _include_flags(include: Path) -> list[str]:
    # <asm/...> lives in the multiarch directory of the same package, not the host's.
    arch = subprocess.run(
        ["gcc", "-print-multiarch"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirs = [include] + ([include / arch] if arch and (include / arch).is_dir() else [])
    return [f"-I{d}" for d in dirs]


@pytest.fixture(scope="session")
def uapi_include() -> Path:
    return Path(script_output("uapi-headers.sh"))


@pytest.fixture(scope="session")
def header_numbers(uapi_include, tmp_path_factory) -> tuple[dict[str, tuple[int, int]], set[str]]:
    return read_ioctl_numbers(
        uapi_include,
        (v.header for v in TABLES),
        (i.name for _, i in CASES),
        tmp_path_factory.mktemp("uapi"),
    )


@pytest.mark.parametrize(("vendor", "ioctl"), CASES, ids=[f"{v.name}:{i.name}" for v, i in CASES])
def test_ioctl_matches_uapi_header(vendor: Vendor, ioctl: Ioctl, uapi_include, header_numbers):
    found, missing = header_numbers
    assert ioctl.name not in missing, f"{ioctl.name} is not defined by the uapi headers"
    assert re.search(rf"\b{ioctl.name}\b", (uapi_include / vendor.header).read_text()), (
        f"{ioctl.name} is not declared in {vendor.header}"
    )
    nr, typ = found[ioctl.name]
    assert ioctl.nr == nr, (
        f"{vendor.name}: {ioctl.name} is nr {nr:#04x}, table says {ioctl.nr:#04x}"
    )
    assert typ == DRM_IOCTL_TYPE, f"{ioctl.name} has ioctl type {chr(typ)!r}, not 'd'"


def test_missing_macro_is_reported(uapi_include, tmp_path):
    found, missing = read_ioctl_numbers(
        uapi_include, ["drm/drm.h"], ["DRM_IOCTL_VERSION", "DRM_IOCTL_NO_SUCH_THING"], tmp_path
    )
    assert missing == {"DRM_IOCTL_NO_SUCH_THING"}
    assert found == {"DRM_IOCTL_VERSION": (0x00, DRM_IOCTL_TYPE)}
