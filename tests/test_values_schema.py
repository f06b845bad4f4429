"""The chart's values.schema.json takes the agent's config as the agent does: its `config` part is
what scripts/values_schema.py generates from kubenpu.config.Config, and helm (Python's Draft 7
validator and real helm) accepts and refuses what the agent's loader does, at every bound."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import CHART, helm, helm_values
from pydantic import ValidationError

from kubenpu.config import Config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def test_the_committed_schema_is_the_generated_one(tmp_path: Path) -> None:
    out = tmp_path / "values.schema.json"
    subprocess.run([sys.executable, ROOT / "scripts" / "values_schema.py", out], check=True)
    assert out.read_text() == (CHART / "values.schema.json").read_text(), (
        "run scripts/values_schema.py and commit deploy/helm/kubenpu/values.schema.json"
    )


def leaves(schema: dict[str, Any], path: str = "config") -> Iterator[tuple[str, dict[str, Any]]]:
    """Each key of the agent's config that is not a section, as helm_values' `a__b` path."""
    for key, sub in schema.get("properties", {}).items():
        if "properties" in sub:
            yield from leaves(sub, f"{path}__{key}")
        else:
            yield f"{path}__{key}", sub


LEAVES = dict(leaves(SCHEMA["properties"]["config"]))
# Keys the agent checks further than the schema states (the config schema's $comment says why):
# there the schema may take what the agent refuses, never the other way round.
AGENT_ONLY = {
    f"config__export__prometheus__{key}"
    for key in ("tls__cert_file", "tls__key_file", "auth__username", "auth__password_file")
} | {f"config__guard__{key}" for key in ("heartbeat_seconds", "fail_open_seconds")}


def candidates(leaf: dict[str, Any]) -> list[Any]:
    """Each bound, one either side of it, each allowed value and one that is not, the longest
    string and one longer."""
    near = [bound + step for k in BOUNDS if k in leaf for bound in [leaf[k]] for step in (-1, 0, 1)]
    longest = ["x" * (leaf["maxLength"] + step) for step in (0, 1)] if "maxLength" in leaf else []
    return near + longest + leaf.get("enum", []) + (["bogus"] if "enum" in leaf else [])


def agent_takes(values: dict[str, Any]) -> bool:
    try:
        Config.model_validate(values["config"])
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("path", LEAVES)
def test_the_schema_and_the_agent_agree_at_every_bound(path: str) -> None:
    for value in candidates(LEAVES[path]):
        # bccFallback: the chart's own rule on probe.attach and .loader is tested below
        values = helm_values(bccFallback=True, **{path: value})
        taken = agent_takes(values)
        agree = VALIDATOR.is_valid(values) == taken or (path in AGENT_ONLY and not taken)
        assert agree, f"{path}={value!r}"


# Config values on both sides of an edge: (key, value, taken by the agent and by helm).
EDGES = [
    ("probe__ringbuf_pages", 100, False),  # not a power of two: taken by the hand-written schema
    ("probe__ringbuf_pages", 128, True),
    ("probe__ringbuf_pages", 65536, True),
    ("probe__ringbuf_pages", 131072, False),
    ("probe__ringbuf_pages", 0, False),
    ("metrics__series_ttl_seconds", 0, True),  # refused by the hand-written schema
    ("metrics__series_ttl_seconds", -1, False),
    ("metrics__series_ttl_seconds", 2592000, True),
    ("metrics__series_ttl_seconds", 2592001, False),
    ("export__otlp__endpoint", "collector:4317", False),
    ("export__otlp__endpoint", "HTTPS://collector:4317", True),
    ("export__otlp__endpoint", "http:///v1/metrics", False),  # no host
    ("attribution__pod_resources__socket", "kubelet.sock", False),
    ("attribution__pod_resources__socket", "unix:///kubelet.sock", True),
    ("probe__ring_pages", 256, False),  # an unknown key
]


def helm_takes(values: dict[str, Any]) -> bool:
    return helm("lint", "--strict", str(CHART), values=values).returncode == 0


@pytest.mark.tools
@pytest.mark.parametrize(("key", "value", "taken"), EDGES)
def test_helm_takes_what_the_agent_takes(key: str, value: Any, taken: bool) -> None:
    values = helm_values(**{f"config__{key}": value})
    assert (agent_takes(values), VALIDATOR.is_valid(values), helm_takes(values)) == (taken,) * 3


@pytest.mark.tools
@pytest.mark.parametrize("probe", [{"attach": "kprobe"}, {"loader": "bcc"}])
def test_what_needs_bcc_needs_the_bcc_fallback(probe: dict[str, str]) -> None:
    """BCC is only in the -bcc image: the kprobe attach, which only BCC has, and the bcc loader
    make every agent exit 2 without it, so helm refuses them unless bccFallback is true."""
    values = helm_values(**{f"config__probe__{k}": v for k, v in probe.items()})
    assert agent_takes(values)  # the agent's own config allows it: the chart's image does not
    assert (VALIDATOR.is_valid(values), helm_takes(values)) == (False, False)
    values["bccFallback"] = True
    assert (VALIDATOR.is_valid(values), helm_takes(values)) == (True, True)


@pytest.mark.tools
def test_fentry_needs_no_bcc_fallback() -> None:
    values = helm_values(config__probe__attach="fentry")
    assert (VALIDATOR.is_valid(values), helm_takes(values)) == (True, True)
