"""Shared host-side test helpers: test files import these, never each other's private functions."""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

# --- VM test records: the result.json files tests/vm/*_guest.py write -----------------------------
# /metrics samples in a record are read with the guests' own projections (tests/vm/guestlib.py).
from vm.guestlib import LABELS, by_reason, ioctl_counts

from kubenpu.resolve import Attribution, Resolver

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["by_reason", "expected_counts", "ioctl_counts", "otlp_counts"]


def expected_counts(rows: list[dict]) -> dict[tuple, float]:
    """A record's expected kubenpu_ioctl_total series ([{labels, value}]) by their LABELS values."""
    return {tuple(r["labels"]): r["value"] for r in rows}


def otlp_counts(points: list[dict]) -> dict[tuple, float]:
    """The kubenpu.ioctl points an OTLP receiver got ([{attributes, value}]) by LABELS values."""
    return {tuple(p["attributes"][k] for k in LABELS): p["value"] for p in points}


# --- Helm: the chart rendered by real helm (fetched by scripts/k8s-tools.sh); used by the deploy
# tests and by the VM tests that run the agent with the chart's settings.

CHART = ROOT / "deploy" / "helm" / "kubenpu"
RELEASE = NAMESPACE = "kubenpu"


@functools.cache
def k8s_tools() -> Path:
    """The directory holding helm and kubectl (downloaded once, then cached)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "k8s-tools.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def helm_values(**overrides: Any) -> dict[str, Any]:
    """The chart's values.yaml with overrides; `a__b=v` sets values["a"]["b"] = v."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = values
        for key in parents:
            node = node[key]
        node[leaf] = value
    return values


def helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with `values` (merged over the chart's defaults by helm itself) on stdin."""
    return subprocess.run(
        [str(k8s_tools() / "helm"), *args, "--values", "-"],
        input=yaml.safe_dump(values or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def render_helm(
    values: dict[str, Any] | None = None, chart: Path = CHART, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its objects, parsed."""
    proc = helm("template", RELEASE, str(chart), "--namespace", namespace, values=values)
    assert proc.returncode == 0, f"helm template: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


# --- resolve: wait for what a Resolver answers once its CRI lookup (off the caller's thread) ends

T = TypeVar("T")


def eventually(check: Callable[[], T | None], what: str, bound: float = 30.0) -> T:
    """check()'s first answer that is not None or False; a generous bound, not a timing claim."""
    deadline = time.monotonic() + bound
    while (value := check()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound:g}s")
        time.sleep(0.005)
    return value


def resolved(resolver: Resolver, cgroup_id: int) -> Attribution:
    """Polls resolve() until the pending lookup has answered."""
    return eventually(lambda: resolver.resolve(cgroup_id), f"cgroup {cgroup_id} resolved")


# --- bpffs: run a check against the real bpf(2) syscall in a private mount namespace, with a bpffs
# of its own (tests/test_pin.py); skipped where the process may not make BPF maps or mounts.

_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000


def _may_make_maps() -> bool:
    import os

    from kubenpu import bpfsys

    try:
        os.close(bpfsys.map_create(bpfsys.MAP_TYPE_ARRAY, 4, 4, 1, "probe"))
    except bpfsys.BpfError:
        return False
    return True


def in_private_bpffs(check: Callable[[Path], T]) -> T:
    """`check(bpffs_dir)` in a forked child that has its own mount namespace and bpffs; its
    return value (pickled back), or its exception re-raised as AssertionError; pytest.skip
    when namespaces, bpffs or BPF maps are not available here."""
    import ctypes
    import os
    import pickle
    import tempfile
    import traceback

    import pytest

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome: tuple[str, Any]
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            where = Path(tempfile.mkdtemp(prefix="bpffs-"))
            if (
                libc.unshare(_CLONE_NEWNS) != 0
                or libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0
                or libc.mount(b"bpf", bytes(where), b"bpf", 0, None) != 0
            ):
                outcome = ("skip", f"no private bpffs: {os.strerror(ctypes.get_errno())}")
            elif not _may_make_maps():
                outcome = ("skip", "BPF maps need privileges this test run lacks")
            else:
                outcome = ("ok", check(where))
        except Exception:
            outcome = ("error", traceback.format_exc())
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "skip":
        pytest.skip(value)
    if kind == "error":
        raise AssertionError(value)
    return value
