"""The docs name only what exists: every file, module, class, function and config key that
docs/architecture.md quotes is checked against the tree (HELP texts vs docs/metrics.md are checked
in test_metrics.py). And they say what the code does, where a test can tell: capabilities vs
the rendered chart, the default hook, timings vs the constants, the stage order."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest
import yaml
from helpers import CHART, chart_capabilities
from test_imports import LAYERS

from kubenpu.agent import loop
from kubenpu.config import ProbeConfig
from kubenpu.kernel import abi
from kubenpu.kernel import guard as guard_kernel
from kubenpu.kernel.errors import ProbeError
from kubenpu.metrics.catalogue import SPECS
from kubenpu.resolve import resolver
from kubenpu.sources import contention, energy, jobs

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
QUOTED = re.findall(r"`([^`]+)`", ARCHITECTURE)


def _defined_names() -> set[str]:
    """Every class, function, method, enum member and module-level name defined in kubenpu/."""
    names: set[str] = set()
    for path in (ROOT / "kubenpu").rglob("*.py"):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
                names.update(t.attr for t in targets if isinstance(t, ast.Attribute))
    return names


def _config_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _config_keys(value, f"{prefix}{key}.")
    return keys


CODE_NAME = re.compile(r"^([A-Za-z_]\w*)(\.[A-Za-z_]\w*)?\(|^[A-Z][a-z]\w*$|^[A-Z]\w*\.[a-z_]\w*$")
PATH = re.compile(r"^[\w.-]+/[\w./-]*$")
CONFIG_KEY = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def test_the_architecture_doc_quotes_code():
    # If these patterns stopped matching, the test below would check nothing.
    assert sum(bool(CODE_NAME.match(q)) for q in QUOTED) >= 20
    assert sum(bool(PATH.match(q)) for q in QUOTED) >= 8


@pytest.mark.parametrize("path", sorted({q for q in QUOTED if PATH.match(q)}))
def test_every_quoted_path_exists(path):
    assert (ROOT / path).exists(), f"docs/architecture.md names {path}, which does not exist"


@pytest.mark.parametrize("quoted", sorted({q for q in QUOTED if CODE_NAME.match(q)}))
def test_every_quoted_class_and_function_exists(quoted):
    names = _defined_names() | set(dir(builtins))
    for part in re.findall(r"([A-Za-z_]\w*)(?=\(|\.|$)", quoted.split("(")[0]):
        assert part in names, f"docs/architecture.md names {part} ({quoted!r}); kubenpu/ has none"


def test_every_quoted_config_key_exists():
    keys = _config_keys(yaml.safe_load((ROOT / "config" / "kubenpu.yaml").read_text()))
    quoted = {q for q in QUOTED if CONFIG_KEY.match(q) and not q.endswith((".py", ".c", ".md"))}
    short = {k.split(".", 1)[1] for k in keys if "." in k}
    missing = {q for q in quoted if q not in keys and q not in short}
    assert not missing, f"docs/architecture.md names config keys that do not exist: {missing}"


@pytest.mark.parametrize("spec", ["Kind", "Vendor", "Device", "Tally", "Resolver", "Series"])
def test_named_public_surfaces_are_quoted(spec):
    # The table lists each stage's public surface; these must stay in it.
    assert f"`{spec}" in ARCHITECTURE


def test_the_drops_contract_lists_every_drop_reason():
    from kubenpu.metrics.catalogue import Drop

    contract = ARCHITECTURE.split("- **Drops.**", 1)[1].split("\n- ", 1)[0]
    quoted = set(re.findall(r"`([a-z_]+)` \(", contract))  # each reason is followed by its why
    assert {r.value for r in Drop} == quoted


# --- what the docs claim, checked against what the code and the chart do --------------------

CAPS = re.compile(r"`?CAP_\w+`?(?: \+\s+`?CAP_\w+`?)*")
DEFAULT_HOOK = "security_file_ioctl"


def _doc(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())  # line breaks read as spaces


def _caps(claim: str) -> list[str]:
    """The capabilities a claim like "`CAP_BPF` + `CAP_PERFMON`" names, as the chart spells them."""
    return sorted(re.findall(r"CAP_(\w+)", claim))


def _caps_after(text: str, marker: str, start: int = 0) -> list[str]:
    """The first capabilities named after `marker` (itself looked for from `start`)."""
    found = CAPS.search(text, text.index(marker, start))
    assert found, f"no capabilities after {marker!r}"
    return _caps(found.group())


@pytest.mark.parametrize(
    ("path", "markers"),
    [
        ("README.md", ["The agent runs as a DaemonSet, not privileged, with"]),
        ("docs/deploy.md", ["it gets the capabilities", "for `fdinfo.enabled` (the default),"]),
    ],
)
def test_the_stated_capabilities_are_the_charts(path, markers):
    """The default chart's set: the default hook's capabilities and fdinfo's (on by default)."""
    text = _doc(path)
    start = text.index(markers[0])
    stated = sorted({cap for marker in markers for cap in _caps_after(text, marker, start)})
    assert stated == chart_capabilities(DEFAULT_HOOK, fdinfo=True), f"{path}: {stated}"


def test_values_yaml_says_what_fdinfo_off_leaves():
    """values.yaml's fdinfo comment: what it adds, and each hook's set without it."""
    comment = " ".join(
        line.strip().lstrip("#").strip()
        for line in (CHART / "values.yaml").read_text().splitlines()
        if line.strip().startswith("#")
    )
    claim = comment[comment.index("Device time and memory per pod") :]
    claim = claim[: claim.index("mounts no /proc")]
    added = _caps_after(claim, "also gets")
    without = dict(
        (hook, _caps(caps)) for caps, hook in re.findall(rf"({CAPS.pattern}) \((\w+)\)", claim)
    )
    assert set(without) == {"security_file_ioctl", "drm_ioctl"}
    for hook, caps in without.items():
        assert caps == chart_capabilities(hook, fdinfo=False), hook
        assert sorted({*caps, *added}) == chart_capabilities(hook, fdinfo=True), hook


def test_the_default_hook_is_named_alike_everywhere():
    from kubenpu import config

    assert config.ProbeConfig().hook == DEFAULT_HOOK
    assert (
        yaml.safe_load((ROOT / "config/kubenpu.yaml").read_text())["probe"]["hook"] == DEFAULT_HOOK
    )
    assert (
        yaml.safe_load((CHART / "values.yaml").read_text())["config"]["probe"]["hook"]
        == DEFAULT_HOOK
    )
    table = (ROOT / "docs/configuration.md").read_text()
    [cells] = [
        re.split(r"(?<!\\)\|", line)  # a cell's own "\|" is no column
        for line in table.splitlines()
        if line.startswith("| `probe.hook` |")
    ]
    assert cells[3].strip() == f"`{DEFAULT_HOOK}`", "docs/configuration.md's default column"
    for path in ("README.md", "docs/deploy.md"):
        named = re.findall(r"the default `probe\.hook: (\w+)`", _doc(path))
        assert named and set(named) == {DEFAULT_HOOK}, path
    assert re.search(
        rf"`{DEFAULT_HOOK}`[^.]*\(vmlinux; the default `probe\.hook`\)", _doc("README.md")
    )


def test_the_guard_doc_quotes_the_guards_own_lines(tmp_path):
    """docs/guard.md quotes the line the agent logs on a kernel without the BPF LSM and names the
    capabilities the guard checks for: both as kubenpu/kernel/guard.py has them."""
    text = _doc("docs/guard.md")
    lsm = tmp_path / "lsm"
    lsm.write_text("lockdown,capability,landlock,yama,apparmor\n")  # a kernel without `bpf`
    with pytest.raises(ProbeError) as no_lsm:
        guard_kernel.check(lsm=lsm)
    assert str(no_lsm.value).replace(str(lsm), str(guard_kernel.LSM_LIST)) in text
    needs = ", ".join(f"CAP_{c}" for c in guard_kernel.NEEDED)
    assert f"the access guard needs {needs} to load its LSM programs" in text
    assert f"`{guard_kernel.LSM_LIST}`" in text


# (doc, the claim with the number in it, the constant it states)
TIMINGS = [
    ("docs/metrics.md", r"retries them at every flush \(every ([\d.]+) s\)", loop._FLUSH_SECONDS),
    ("docs/metrics.md", r"within ([\d.]+) s of each CRI answer", loop._ANSWERS_EVERY_SECONDS),
    ("docs/architecture.md", r"at once \(at most every ([\d.]+) s\)", loop._ANSWERS_EVERY_SECONDS),
    ("docs/architecture.md", r"not at the next ([\d.]+) s flush", loop._FLUSH_SECONDS),
    ("docs/architecture.md", r"reads the map in batches every ([\d.]+) s", loop._READ_SECONDS),
    (
        "docs/architecture.md",
        r"asked again after ([\d.]+) s, doubling",
        resolver._FIRST_RETRY_SECONDS,
    ),
    ("docs/configuration.md", r"one batch \(([\d.]+) s of events", loop._FLUSH_SECONDS),
    ("docs/jobs.md", r"no reset takes within ([\d.]+) s", jobs.STALE_RISE_SECONDS),
    ("docs/jobs.md", r"only those older than\s+([\d.]+) s", contention.MARGIN_NS / 1e9),
]


# (doc, the claim with the number in it, the constant it states)
NUMBERS = [
    (
        "docs/metrics.md",
        r"device could make in Δt:\s+(\d+) \N{MULTIPLICATION SIGN}\s+its highest power limit",
        energy.POWER_MARGIN,
    ),
    (
        "docs/metrics.md",
        r"or\s+(\d+) W where the driver\s+publishes no limit",
        energy.FALLBACK_WATTS,
    ),
]


@pytest.mark.parametrize(("path", "claim", "number"), NUMBERS, ids=lambda t: str(t)[:40])
def test_stated_numbers_are_the_codes(path, claim, number):
    found = re.search(claim, _doc(path))
    assert found, f"{path} no longer says {claim!r}: update NUMBERS with what it says now"
    assert int(found.group(1)) == number


@pytest.mark.parametrize(("path", "claim", "seconds"), TIMINGS, ids=lambda t: str(t)[:40])
def test_stated_timings_are_the_codes(path, claim, seconds):
    found = re.search(claim, _doc(path))
    assert found, f"{path} no longer says {claim!r}: update TIMINGS with what it says now"
    assert float(found.group(1)) == seconds


# Claims that were false once; each fix above has a test of its meaning, this keeps the words out.
FALSE_CLAIMS = [
    ("docs/configuration.md", "sent on a worker thread"),
    ("kubenpu/export/server.py", "sent at once, each on a worker thread"),
    ("deploy/helm/kubenpu/values.yaml", "SYS_ADMIN alone"),
    ("docs/architecture.md", "lives here only"),
    ("docs/architecture.md", "OTel data points"),
    ("docs/architecture.md", "Read the folder list top to bottom"),
    ("docs/metrics.md", "retries every 0.5 s"),
    ("docs/core.md", "costs one hash lookup (`devices`"),
    ("docs/configuration.md", "a short-lived child process compiles and loads the probe"),
    ("bpf/kubenpu.bpf.c", "so the hot path has one hash lookup"),
]


@pytest.mark.parametrize(("path", "words"), FALSE_CLAIMS)
def test_claims_found_false_stay_out(path, words):
    assert words not in _doc(path)


def test_the_stage_table_follows_the_data_flow():
    """architecture.md's table lists the stages in the order of README's data-flow line."""
    [flow] = re.findall(r"^`bpf/` → .*$", (ROOT / "README.md").read_text(), re.M)
    stages = [s.strip("`/") for s in flow.split(" → ")]
    rows = [
        line.split("|")[1].strip() for line in ARCHITECTURE.splitlines() if line.startswith("| ")
    ]
    assert [s for s in rows if s in set(stages)] == stages


def test_the_export_snapshot_is_spec_and_point():
    """architecture.md says what Series.collect() hands export: the project's own types."""
    import typing

    from kubenpu.metrics.catalogue import Spec
    from kubenpu.metrics.points import Point
    from kubenpu.metrics.series import Series

    assert "`collect()` gives export plain `(Spec, [Point])` snapshots" in ARCHITECTURE
    assert typing.get_type_hints(Series.collect)["return"] == list[tuple[Spec, list[Point]]]


def test_the_allocations_doc_says_what_the_chart_and_code_do():
    """docs/allocations.md: the chart turns pod_resources on, the refresh interval is the
    default, and its id table names every plugin format's resource."""
    from kubenpu.config import PodResourcesConfig
    from kubenpu.resolve.podresources.mapping import PLUGINS, Unmapped

    text = _doc("docs/allocations.md")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert "(`config.attribution.pod_resources.enabled: true`)" in text
    assert values["config"]["attribution"]["pod_resources"]["enabled"] is True
    found = re.search(r"every `attribution\.pod_resources\.interval_seconds` \(([\d.]+) s\)", text)
    assert found and float(found.group(1)) == PodResourcesConfig().interval_seconds
    for fmt in PLUGINS:
        example = fmt.resource.pattern.replace("\\", "").split("(")[0].rstrip("/.+")
        assert example in text, fmt.plugin
        source_file = fmt.source.split()[1]  # "<repository> <file> <function>: ..."
        assert f"`{source_file}`" in text, fmt.plugin
    for reason in Unmapped:
        assert f"`{reason}`" in text, reason


def test_the_metrics_doc_names_every_drivers_telemetry_file():
    """docs/metrics.md's sources table lists each driver file kubenpu/sources/sysfs.py reads."""
    from kubenpu.sources.sysfs import DRIVER_FILES

    doc = (ROOT / "docs" / "metrics.md").read_text()
    section = doc[doc.index("Sources per driver") : doc.index("### Energy per pod")]
    rows = {
        line.split("|")[1].strip().split()[0]: line
        for line in section.splitlines()[4:]
        if line.startswith("| ")
    }
    for driver, files in DRIVER_FILES.items():
        row = rows["ivpu" if driver == "intel_vpu" else driver]
        for path in (p for item in files for p in item.paths):
            name = path.rpartition("/")[2].removesuffix("*")
            assert name in row, (driver, path)


# --- the map lists: each doc names every map abi.py has, and no other -----------------------------
ALL_MAPS = {*abi.MAPS, abi.COUNTS, *abi.DURATION_MAPS}
MAP_TYPE_NAMES = {
    abi.MAP_TYPE_HASH: "hash",
    abi.MAP_TYPE_ARRAY: "array",
    abi.MAP_TYPE_PERCPU_HASH: "percpu_hash",
    abi.MAP_TYPE_PERCPU_ARRAY: "percpu_array",
    abi.MAP_TYPE_RINGBUF: "ringbuf",
    abi.MAP_TYPE_TASK_STORAGE: "task_storage",
}


def _table(path: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table in `path` whose header row starts with `header`."""
    lines = (ROOT / path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_architecture_bpf_row_names_every_map():
    [row] = [line for line in ARCHITECTURE.splitlines() if line.startswith("| bpf |")]
    maps = row.split(" maps ", 1)[1].split("; programs", 1)[0]
    assert set(re.findall(r"`(\w+)`", maps)) == ALL_MAPS


def test_the_pin_table_names_every_map():
    cells = [row[0] for row in _table("docs/pinning.md", "| pin |")]
    pins = {name for cell in cells for name in re.findall(r"`([\w<>-]+)`", cell)}
    assert {p for p in pins if not p.startswith(abi.LINK)} == ALL_MAPS | {"meta"}


def test_the_core_map_table_is_the_abis():
    rows = _table("docs/core.md", "| map |")
    shapes = abi.map_shapes(
        True, ProbeConfig().ringbuf_pages, abi.COUNTS_ENTRIES, abi.DURATIONS_ENTRIES
    )
    assert {r[0].strip("`"): (r[1], *map(int, r[2:5])) for r in rows} == {
        name: (MAP_TYPE_NAMES[s.type], s.key_size, s.value_size, s.max_entries)
        for name, s in shapes.items()
    }


def test_the_hot_path_names_the_device_array_and_hash():
    hot_path = _doc("docs/core.md").split("## The hot path", 1)[1].split("##", 1)[0]
    assert {"`minors`", "`devices`", "`ioctls`", "`gate`", "`counts`"} <= set(
        re.findall(r"`\w+`", hot_path)
    )


def test_the_readme_states_no_test_count():
    """A count of tests goes stale with the next test added."""
    assert not re.search(r"\d[\d,]* tests\b", _doc("README.md"))


def _layer_path(module: str) -> str:
    if module == "kubenpu":
        return "kubenpu/__init__.py"
    path = module.replace(".", "/")
    return f"{path}/" if (ROOT / path).is_dir() else f"{path}.py"


def test_the_layout_lists_the_import_layers():
    section = ARCHITECTURE.split("## Layout: the import layers", 1)[1].split("\n## ", 1)[0]
    listed = [re.findall(r"`([^`]+)`", line) for line in re.findall(r"^\d+\. .*$", section, re.M)]
    assert listed == [[_layer_path(m) for m in layer] for layer in LAYERS]


# Names of the kubenpu_ form that are not metrics: the pinned births map, the VM's test driver,
# the old name of a renamed metric (upgrade.md), and prefixes ("every kubenpu_device_* metric").
# The kernel programs' names (bpftool shows them; docs/performance.md quotes them) are none either.
_PROGRAMS = {abi.BIRTHS, *abi.IOCTL_PROGRAMS.values()}
_PROGRAMS |= {p for exits in abi.EXIT_PROGRAMS.values() for p in exits.values()}
_NOT_METRICS = {
    "kubenpu_births",
    "kubenpu_testdrm",
    "kubenpu_device_throttle",
    "kubenpu_placement",  # the sched_ext scheduler's name (docs/scheduler.md)
    *_PROGRAMS,
}


def _exported_names() -> set[str]:
    names = set()
    for spec in SPECS:
        for name in (spec.prometheus_name, spec.translated_name):
            names |= {name, name.removesuffix("_total")}
            if spec.kind == "histogram":
                names |= {f"{name}_{end}" for end in ("bucket", "count", "sum")}
    return names


def test_the_docs_name_only_metrics_that_exist():
    """troubleshooting.md once sent a user to kubenpu_unattributed_total, which never existed
    (kubenpu_unattributed_calls_total does)."""
    exported, wrong = _exported_names(), set()
    docs = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", *(CHART / "templates").glob("*.txt")]
    for path in docs:
        for name in re.findall(r"\bkubenpu_[a-z0-9_]*[a-z0-9]\b", path.read_text()):
            if name not in exported and name not in _NOT_METRICS:
                wrong.add(f"{path.relative_to(ROOT)}: {name}")
    assert sorted(wrong) == []
