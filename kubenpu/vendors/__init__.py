"""Vendor plug-ins: which driver ioctls count as submit, alloc or wait.

A plug-in is one small module in this package that defines ``VENDOR``. Its numbers come from
the kernel's uapi header named in ``Vendor.header`` and are checked against that header by
tests/test_vendor_headers.py. Adding hardware means copying a plug-in and filling in numbers.

Classification rules (docs/vendors.md has the long form):
- submit: sends work to the device (execbuffer, submit, cs, job submit);
- alloc: creates device memory or buffer objects (gem/bo create, userptr, dumb buffers);
- wait: blocks until the device has finished work (bo wait, wait fence, cpu-prep, syncobj wait);
- anything else is not counted.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from enum import IntEnum
from functools import cache


class Kind(IntEnum):
    """What a counted ioctl does. The values are shared with bpf/kubenpu.bpf.c."""

    SUBMIT = 1
    ALLOC = 2
    WAIT = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Ioctl:
    nr: int  # cmd & 0xff, i.e. DRM_COMMAND_BASE already added for driver ioctls (kernel.abi)
    kind: Kind
    name: str  # the uapi macro, e.g. DRM_IOCTL_I915_GEM_EXECBUFFER2


@dataclass(frozen=True)
class Vendor:
    name: str  # label value, e.g. "i915"
    drivers: tuple[str, ...]  # sysfs driver names that select this plug-in
    header: str  # uapi header, relative to include/uapi (e.g. "drm/i915_drm.h")
    ioctls: tuple[Ioctl, ...]

    def __post_init__(self) -> None:
        nrs = [i.nr for i in self.ioctls]
        if len(nrs) != len(set(nrs)):
            raise ValueError(f"vendor {self.name}: duplicate ioctl nr")


@cache
def core() -> Vendor:
    """The DRM core table (vendor label ``drm``), which applies to every vendor."""
    return importlib.import_module(f"{__name__}._core").VENDOR


@cache
def all_vendors() -> tuple[Vendor, ...]:
    """Every driver plug-in in this package, sorted by name (the core table excluded)."""
    found = []
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            found.append(importlib.import_module(f"{__name__}.{mod.name}").VENDOR)
    return tuple(sorted(found, key=lambda v: v.name))


def for_driver(driver: str | None) -> Vendor | None:
    """The plug-in that handles a sysfs driver name, or None."""
    if not driver:
        return None
    return next((v for v in all_vendors() if driver in v.drivers), None)


def by_name(name: str) -> Vendor | None:
    if name == core().name:
        return core()
    return next((v for v in all_vendors() if v.name == name), None)
