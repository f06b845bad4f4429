#!/usr/bin/env python3
"""`make mutation`: mutmut on one module at a time, with only the test files that exercise it.

mutmut 3 reads one [tool.mutmut] from pyproject.toml (all of kubenpu, every unit test). A run of
that is hours on two cores; this driver runs mutmut once per module in a fresh process with
only_mutate narrowed to the module and the test selection narrowed to its entry in TESTS, so
one module is minutes. Each run starts from an empty mutants/ (a changed test selection would
invalidate the previous run's stats anyway), and its verdicts are read from mutants/*.meta
before the next module. Prints killed / total per module and lists the survivors
(docs/mutation.md says which are equivalent, and why).

    scripts/mutation.py                       # every module in TESTS
    scripts/mutation.py kubenpu/sources/energy.py     # some of them
    MUTATION_CHILDREN=1 scripts/mutation.py   # fewer parallel pytest children (default 2)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Module (a file, or a package directory) -> the unit test files that exercise it.
TESTS: dict[str, list[str]] = {
    "kubenpu/sources/energy.py": [
        "tests/test_energy.py",
        "tests/test_telemetry.py",
        "tests/test_properties.py",
    ],
    "kubenpu/sources/fdinfo.py": [
        "tests/test_fdinfo.py",
        "tests/test_usage.py",
        "tests/test_properties.py",
    ],
    "kubenpu/sources/sysfs.py": [
        "tests/test_telemetry.py",
        "tests/test_telemetry_golden.py",
        "tests/test_telemetry_files.py",
        "tests/test_telemetry_edges.py",
        "tests/test_ctl.py",
    ],
    "kubenpu/sources/telemetry.py": [
        "tests/test_telemetry.py",
        "tests/test_telemetry_golden.py",
        "tests/test_telemetry_loop.py",
        "tests/test_telemetry_edges.py",
        "tests/test_semconv.py",
        "tests/test_telemetry_build.py",  # build()'s wiring, the beat, the deadline's waits
    ],
    "kubenpu/sources/allocations.py": [
        "tests/test_allocations.py",
        "tests/test_properties.py",
        "tests/test_metrics.py",  # _capped: the allocations family under the series cap
        "tests/test_payload_golden.py",  # _points: the counters' start stamps, as exported
    ],
    "kubenpu/export/otlp.py": [
        "tests/test_export.py",
        "tests/test_metrics.py",
        "tests/test_otlp.py",
        "tests/test_semconv.py",
        "tests/test_properties.py",
    ],
    "kubenpu/kernel/maps.py": ["tests/test_kernel.py", "tests/test_pin.py"],
    "kubenpu/resolve/podresources/": ["tests/test_allocations.py"],
    "kubenpu/sources/wedges.py": ["tests/test_uevents.py"],
    "kubenpu/cli/rollout.py": ["tests/test_rollout.py"],
    "kubenpu/kernel/core.py": [
        "tests/test_core_loader.py",
        "tests/test_kernel.py",
        "tests/test_abi.py",
        "tests/test_start_errors.py",
    ],
}

# Tests of the process itself, which mutmut's trampolines change (they allocate as the code
# runs, and are the mutmut module): the baseline run fails them ("Failed to run clean test").
# They hold no module's logic.
DESELECT = [
    "tests/test_metrics.py::test_churn_of_1000_containers_returns_memory_to_baseline",
    "tests/test_ctl.py::test_needs_only_the_standard_library",
]

# The verdicts mutmut stores per mutant (mutmut.stats.status_by_exit_code, mutmut 3.8.1). A
# segfault (-11) is a killed mutant too: the tests' process died (a mutant that hands libbpf a
# null pointer), so the suite failed; so is an abort (-6: gRPC's C core aborts on a client key
# handed over without its certificate).
KILLED = {1, 3, 24, -24, 36, 152, 255, 37, -11, -6}  # a failing test, a timeout, the type checker
SURVIVED = {0}


def only_mutate(module: str) -> list[str]:
    """mutmut's glob patterns for a module; a package's generated *_pb2* files are not ours."""
    return [f"{module}*.py"] if module.endswith("/") else [module]


def run_one(module: str, children: int) -> None:
    """In this process: mutmut run with the config narrowed to module and its tests."""
    from mutmut import configuration

    # tests/testdata holds sysfs trees whose device links point back up the tree: mutmut's
    # copytree into mutants/ would follow them without end (gigabytes); copy them as links.
    copytree = shutil.copytree

    def copy_links(src: Path, dst: Path, symlinks: bool = True, *args: Any, **kwargs: Any) -> Any:
        return copytree(src, dst, True, *args, **kwargs)

    shutil.copytree = copy_links
    base = configuration.config()
    configuration._config = dataclasses.replace(
        base,
        only_mutate=only_mutate(module),
        pytest_add_cli_args_test_selection=TESTS[module] + [f"--deselect={t}" for t in DESELECT],
    )
    from mutmut.__main__ import cli

    cli(["run", "--max-children", str(children)], standalone_mode=True)


def verdicts(module: str) -> dict[str, int | None]:
    """Mutant name -> exit code, from the .meta files mutmut wrote for module."""
    found: dict[str, int | None] = {}
    base = ROOT / "mutants" / module
    metas = base.rglob("*.py.meta") if module.endswith("/") else [Path(f"{base}.meta")]
    for meta in metas:
        if "_pb2" in meta.name or not meta.exists():
            continue
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def diff(name: str) -> str:
    """A mutant's diff, from the mutated copy in mutants/ (before the next module removes it)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    module = name.split(".x_")[0].split(".x\u01c1")[0]
    path = Path(*module.split(".")).with_suffix(".py")
    mutated = (ROOT / "mutants" / path).read_text()
    lines = get_diff_for_mutant(name, source=mutated, path=path).splitlines()
    return "\n".join(f"      {line}" for line in lines[2:])  # the --- / +++ lines name the file


def report(module: str, codes: dict[str, int | None]) -> tuple[int, int]:
    killed = sum(code in KILLED for code in codes.values())
    survivors = sorted(name for name, code in codes.items() if code in SURVIVED)
    other = sorted(
        f"{name} ({code})"
        for name, code in codes.items()
        if code not in KILLED and code not in SURVIVED
    )
    total = len(codes)
    score = 100 * killed / total if total else 0.0
    print(f"\n{module}: {killed} / {total} killed ({score:.1f} %)")
    for name in survivors:
        print(f"  survived: {name}\n{diff(name)}")
    for name in other:
        print(f"  not killed: {name}")
    return killed, total


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        run_one(argv[1], int(os.environ.get("MUTATION_CHILDREN", "2")))
        return 0
    modules = argv or list(TESTS)
    unknown = [m for m in modules if m not in TESTS]
    if unknown:
        print(f"no test map for {unknown}; known: {list(TESTS)}", file=sys.stderr)
        return 2
    scores: dict[str, tuple[int, int]] = {}
    for module in modules:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        print(f"== mutmut on {module} with {' '.join(TESTS[module])}", flush=True)
        run = subprocess.run([sys.executable, __file__, "--one", module], cwd=ROOT, check=False)
        if run.returncode != 0:
            print(f"mutmut failed on {module} (exit {run.returncode})", file=sys.stderr)
            return run.returncode
        scores[module] = report(module, verdicts(module))
    print("\nmodule: killed / total")
    for module, (killed, total) in scores.items():
        print(f"  {module}: {killed} / {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
