"""What every guest scenario does around the agent, in one place: write its config, start it,
wait for its attach line, make calls with drmcall, and scrape and parse /metrics. Used by the
e2e, node, least-privilege and lockdown scripts here and by bench/bench_guest.py inside the QEMU
guest; the host tests read the guests' records with the same projections (LABELS, ioctl_counts,
by_reason) through tests/helpers.py.

It knows the agent only by its command line, its config file and its start-up line (ATTACHED).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.maps import Maps, tables

if TYPE_CHECKING:
    from cri_server import CriTestServer  # tests/, on the path of every script that plays CRI

PY = sys.executable


def slowness(cmdline: str) -> float:
    """How many times slower than on an idle host this guest may run: `kubenpu.slow=F` on the
    kernel command line, which tests/vm/run.sh sets from the host's load per core at boot (at
    least 1). Every wait of a scenario scales its deadline by it; no assertion is about time."""
    for word in cmdline.split():
        if word.startswith("kubenpu.slow="):
            try:
                return max(1.0, float(word.removeprefix("kubenpu.slow=")))
            except ValueError:  # not a number: as if unset
                return 1.0
    return 1.0


def _cmdline() -> str:
    try:
        return Path("/proc/cmdline").read_text()
    except OSError:  # not Linux: the unit tests import this module too
        return ""


SLOW = slowness(_cmdline())
DRMCALL = "/usr/local/bin/drmcall"  # tests/vm/src/drmcall.c, built into the root by build.sh
ATTACHED = "probe attached: "  # the agent's start-up line once its probe is attached
ATTACH_TIMEOUT = (
    600 * SLOW
)  # BCC's compile under TCG on a shared host (over 300 s at load 14, 2 cores)
# The agent's timeouts for the CRI and PodResources in every scenario. Its defaults (2 s, 5 s) are
# for a runtime on real hardware; here the runtime is a Python server or containerd under TCG on a
# shared host. One timed-out CRI request leaves the runtime unasked for retry_after_seconds (30 s)
# and opens a new channel for the next, so at load 9-13 the 6.1 least-privilege run never got an
# answer: every call was held, then counted as cri_error once pending_seconds had passed.
RPC_TIMEOUT = min(60.0, 30 * SLOW)  # the configuration's largest is 60
MODES = ("aggregate", "events")  # probe.mode
# The Prometheus endpoint every scenario configures and scrapes.
PROMETHEUS = {"enabled": True, "host": "127.0.0.1", "port": 8080}
OTLP_PORT = 4317  # the guest's OTLP/gRPC receiver (tests/otlp_receiver.py)
# export.otlp of the agents that push to it: every second, so a scenario's end is seen at once.
OTLP = {
    "enabled": True,
    "endpoint": f"http://127.0.0.1:{OTLP_PORT}",
    "protocol": "grpc",
    "interval_seconds": 1,
}
METRICS_URL = f"http://{PROMETHEUS['host']}:{PROMETHEUS['port']}/metrics"
LABELS = ("namespace", "pod", "container", "device", "vendor", "kind")  # of kubenpu_ioctl_total

# DRM ioctl numbers (nr, struct size) the workloads use; see kubenpu/vendors for the tables.
CREATE_DUMB = (0xB2, 32)  # core, alloc
SYNCOBJ_WAIT = (0xC3, 40)  # core, wait
VERSION = (0x00, 64)  # core, not counted
GET_CAP = (0x0C, 16)  # core, not counted
VGEM_FENCE_ATTACH = (0x41, 16)  # vgem, submit
VGEM_FENCE_SIGNAL = (0x42, 8)  # vgem, not counted
VIRTGPU_EXECBUFFER = (0x42, 48)  # virtio_gpu, submit
VIRTGPU_RESOURCE_CREATE = (0x44, 56)  # virtio_gpu, alloc
VIRTGPU_WAIT = (0x48, 8)  # virtio_gpu, wait
TCGETS = 0x5401  # not a DRM ioctl at all (type byte 'T'): a raw request for drmcall --raw
# tests/vm/kmod's test driver (no vendor table: its calls are not counted, its fdinfo is read).
TESTDRM = "platform:kubenpu_testdrm"  # its device id, as discovery and fdinfo name it
TESTDRM_SUBMIT = (0x40, 8)  # each: render +1 ms, copy +0.25 ms, compute +3,000 of +10,000 cycles
TESTDRM_ALLOC = (0x41, 8)  # each: system 64 KiB total (3/4 resident...), vram 1 MiB resident
# Its jobs on a DRM GPU scheduler ring, one at a time: 50 ms, 10 ms, one that hangs, and 0 ms.
TESTDRM_JOB_50MS = (0x42, 8)
TESTDRM_JOB_10MS = (0x43, 8)
TESTDRM_JOB_HANG = (0x44, 8)
TESTDRM_JOB_0 = (0x45, 8)  # done as it starts: the benchmark's jobs/s (bench_guest.py)


def read_log(path: Path) -> str:
    """The text of a log another process is appending to. The /out share (9p) sometimes answers
    ENODATA to such a read (seen on 7.3); a moment later the same read succeeds."""
    for _ in range(20):
        try:
            return path.read_text()
        except OSError:
            time.sleep(0.1)
    return path.read_text()


# --- the agent -------------------------------------------------------------------------------


class Agent:
    """One agent process: `config` written to OUT/NAME.yaml, its output to OUT/NAME.log, run
    under `launcher` (e.g. setpriv). Starting it does not wait: call attach() or wait_attached()."""

    def __init__(
        self, out: Path, config: dict, *, name: str = "agent", launcher: Sequence[str] = ()
    ) -> None:
        self.config_file = out / f"{name}.yaml"
        self.log_file = out / f"{name}.log"
        self.config_file.write_text(json.dumps(config))  # JSON is YAML
        self.attach_seconds = 0.0
        self.started = time.monotonic()
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(
                [*launcher, PY, "-m", "kubenpu.agent", "--config", str(self.config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return read_log(self.log_file)

    def wait_attached(self, timeout: float = ATTACH_TIMEOUT) -> bool:
        """True once the agent has logged its attach line; False if it exits or `timeout`
        seconds pass first."""
        deadline = self.started + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if ATTACHED in self.log():
                self.attach_seconds = time.monotonic() - self.started
                return True
            time.sleep(0.2)
        return False

    def attach(self, timeout: float = ATTACH_TIMEOUT) -> float:
        """Seconds from start to the attach line; the run fails (naming the log) without it."""
        if not self.wait_attached(timeout):
            rc = self.stop()
            raise SystemExit(f"agent did not attach (exit {rc}); see {self.log_file}")
        return self.attach_seconds

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (a SIGKILL if it is not gone after `timeout` seconds); its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# --- /metrics --------------------------------------------------------------------------------

Samples = dict[str, list[dict]]  # sample name -> [{"labels": {...}, "value": float}]


def parse(text: str) -> Samples:
    """Prometheus text exposition as {sample name: [{labels, value}]} (JSON-ready)."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append({"labels": s.labels, "value": s.value})
    return found


SCRAPE_TIMEOUT = 5 * SLOW  # one request's
SCRAPE_PATIENCE = 60 * SLOW  # retrying failed requests: under TCG on a busy host one can take 5 s+


def scrape(
    save_to: Path | None = None,
    timeout: float = SCRAPE_TIMEOUT,
    patience: float = SCRAPE_PATIENCE,
    url: str = METRICS_URL,
) -> Samples:
    """The agent's /metrics, parsed; the raw text saved if asked. A request that fails (timed
    out, refused) is retried until `patience` seconds have passed, each failure said on stderr:
    one slow scrape must not end a scenario."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as reply:
                text = reply.read().decode()
            break
        except OSError as err:
            if time.monotonic() >= deadline:
                raise
            print(f"guestlib: a scrape failed ({err}); retrying", file=sys.stderr, flush=True)
            time.sleep(1)
    if save_to:
        save_to.write_text(text)
    return parse(text)


def ioctl_counts(
    samples: Samples, name: str = "kubenpu_ioctl_total"
) -> dict[tuple[str, ...], float]:
    """kubenpu_ioctl_total (or a series of the same labels: the timed calls' count,
    kubenpu_ioctl_duration_seconds_count) by its LABELS values."""
    series = samples.get(name, [])
    return {tuple(s["labels"][k] for k in LABELS): s["value"] for s in series}


def by_reason(samples: Samples, metric: str) -> dict[str, float]:
    """A self-metric's non-zero values, summed by its `reason` label."""
    total: Counter[str] = Counter()
    for s in samples.get(metric, []):
        total[s["labels"]["reason"]] += s["value"]
    return {reason: value for reason, value in total.items() if value}


# The fdinfo families of the agent (kubenpu/metrics.py) and what sets a series apart besides the
# pod's labels: a usage series is (metric, namespace, pod, container, device, engine or
# region + state).
USAGE_METRICS = {
    "kubenpu_engine_busy_seconds_total": "busy_ns",
    "kubenpu_engine_cycles_total": "cycles",
    "kubenpu_engine_cycles_elapsed_total": "total_cycles",
    "kubenpu_engine_capacity": "capacity",
    "kubenpu_memory_bytes": "memory",
}
Usage = dict[tuple[str, ...], float]


def usage_series(samples: Samples) -> Usage:
    """The agent's fdinfo series of pods (empty namespace: not a pod, left out)."""
    found: Usage = {}
    for metric in USAGE_METRICS:
        for s in samples.get(metric, []):
            lb = s["labels"]
            if lb["namespace"]:
                rest = (lb["engine"],) if "engine" in lb else (lb["region"], lb["state"])
                found[
                    (metric, lb["namespace"], lb["pod"], lb["container"], lb["device"], *rest)
                ] = s["value"]
    return found


def client_series(clients: list[dict], pods: dict[str, tuple[str, str, str]]) -> Usage:
    """What the agent must export for the clients `kubenpuctl clients --output json` listed,
    summed per container; `pods` names each container's cgroup path. Counters only once above
    0; capacity 1 where the driver prints none, the largest over clients."""
    want: Usage = Counter()
    for c in clients:
        if c["cgroup"] not in pods:
            continue
        who = (*pods[c["cgroup"]], c["device"])
        for engine, stats in c["engines"].items():
            for metric, key in list(USAGE_METRICS.items())[:3]:
                scale = 1e-9 if key == "busy_ns" else 1
                if stats.get(key):
                    want[(metric, *who, engine)] += stats[key] * scale
            cap = ("kubenpu_engine_capacity", *who, engine)
            want[cap] = max(want[cap], stats.get("capacity", 1))
        for region, states in c["memory"].items():  # {state}_bytes: the key names its unit
            for state, value in states.items():
                want[("kubenpu_memory_bytes", *who, region, state.removesuffix("_bytes"))] += value
    return dict(want)


def same_usage(got: Usage, want: Usage) -> bool:
    """Equal keys, and values equal but for float summation (busy seconds are sums of ns)."""
    return got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1e-9 for k in want)


PODRESOURCES = Path("/var/lib/kubelet/pod-resources/kubelet.sock")  # the kubelet's own path


def start_podresources(state: dict, state_file: Path) -> subprocess.Popen:
    """tests/podresources_server.py playing the kubelet's PodResources API at PODRESOURCES,
    answering from `state` (written to state_file), once it listens."""
    state_file.write_text(json.dumps(state))
    PODRESOURCES.parent.mkdir(parents=True, exist_ok=True)
    server = Path(__file__).resolve().parents[1] / "podresources_server.py"
    argv = [PY, str(server), "--socket", str(PODRESOURCES), "--state", str(state_file)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening on"):
        raise SystemExit(f"the PodResources test server did not start (said {line!r})")
    return proc


def load_testdrm() -> str:
    """modprobe tests/vm/kmod's driver; "" when loaded, else why not (the scenario skips it)."""
    lockdown = Path("/sys/kernel/security/lockdown")
    if lockdown.exists() and "[none]" not in lockdown.read_text():
        return "lockdown: the kernel loads no unsigned module"
    done = subprocess.run(["modprobe", "kubenpu_testdrm"], capture_output=True, text=True)
    return done.stderr.strip() or f"modprobe exited {done.returncode}" if done.returncode else ""


# --- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """`count` calls of DRM_IOWR(nr, size) on the device node `path`; with `raw`, `nr` is a
    whole ioctl request, issued as is."""

    path: str
    nr: int
    size: int
    count: int
    raw: bool = False

    @classmethod
    def drm(cls, path: str, ioctl: tuple[int, int], count: int) -> Call:
        return cls(path, ioctl[0], ioctl[1], count)

    def args(self) -> list[str]:
        step = [self.path, hex(self.nr), str(self.size), str(self.count)]
        return ["--raw", *step] if self.raw else step


def drmcall_argv(calls: Sequence[Call], cgroup: Path | None = None, rate: float = 0) -> list[str]:
    """drmcall's command line: from `cgroup` if given, paced to `rate` calls/s if given."""
    argv = [DRMCALL, *(["--rate", str(rate)] if rate else [])]
    argv += ["--cgroup", str(cgroup)] if cgroup else []
    return argv + [a for c in calls for a in c.args()]


def reports(output: str, calls: Sequence[Call]) -> list[dict]:
    """drmcall's JSON report lines, one per call step in order; the run fails if any is
    missing, for another device, or issued another number of calls."""
    found = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    done = [(r["device"], r["calls"]) for r in found]
    if done != [(c.path, c.count) for c in calls]:
        raise SystemExit(f"drmcall did not do what was asked: {calls} -> {output!r}")
    return found


def drmcall(calls: Sequence[Call], cgroup: Path | None = None) -> list[dict]:
    """Run drmcall (in `cgroup`, made if missing) and return its checked reports."""
    if cgroup:
        cgroup.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(drmcall_argv(calls, cgroup), check=True, capture_output=True, text=True)
    return reports(out.stdout, calls)


def device_node(device: Device, prefix: str) -> str:
    """The path of a discovered device's first node named `prefix`* (card, renderD)."""
    return next(n.path for n in device.nodes if n.name.startswith(prefix))


# --- kubelet and the runtime, played: a pod is {id, namespace, pod, container, pod_uid} -------

CGROUP = Path("/sys/fs/cgroup")


def add_container(cri: CriTestServer, pod: dict) -> None:
    """Make the pod's container known to the CRI test server (tests/cri_server.py)."""
    cri.add_container(
        pod["id"], pod["namespace"], pod["pod"], pod["container"], pod_uid=pod["pod_uid"]
    )


def systemd_cgroup(pod: dict) -> Path:
    """A container's cgroup under kubelet's systemd driver (burstable QoS)."""
    uid = pod["pod_uid"].replace("-", "_")
    return (
        CGROUP
        / "kubepods.slice"
        / "kubepods-burstable.slice"
        / f"kubepods-burstable-pod{uid}.slice"
        / f"cri-containerd-{pod['id']}.scope"
    )


def cgroupfs_cgroup(pod: dict) -> Path:
    """A container's cgroup under kubelet's cgroupfs driver (best-effort QoS)."""
    return CGROUP / "kubepods" / "besteffort" / f"pod{pod['pod_uid']}" / pod["id"]


def run_scenario(name: str, scenario: Callable[[Path], dict]) -> int:
    """A guest script's main: run the scenario on /out (or argv[1]), time it, write result.json."""
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    started = time.monotonic()
    result = scenario(out)
    result["guest_seconds"] = round(time.monotonic() - started, 1)
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{name} scenario done on {result['kernel']} in {result['guest_seconds']}s", flush=True)
    return 0


class Returns:
    """What the counted calls of drmcall's steps returned, per key of the kernel's `durations`
    map ({cgroup id, dev_t, kind}): the calls, and the failures by abi.ERRORS name. Which calls
    count is decided as the kernel decides it, from the tables the agent fills it with."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self._by_node, self._ioctls = tables(devices)
        self.calls: Counter[tuple[int, int, int]] = Counter()
        self.errors: Counter[tuple[int, int, int, str]] = Counter()

    def add(self, cgroup: Path, calls: Sequence[Call], found: Sequence[dict]) -> None:
        cgroup_id = cgroup.stat().st_ino  # a cgroup v2 directory's inode is its kernfs id
        for c, report in zip(calls, found, strict=True):
            key = self._key(cgroup_id, c)
            if key is None or not c.count:
                continue
            self.calls[key] += c.count
            for number, n in report["errnos"].items():
                self.errors[(*key, abi.ERRORS[abi.error_slot(-int(number))])] += n

    def _key(self, cgroup_id: int, c: Call) -> tuple[int, int, int] | None:
        cmd = c.nr if c.raw else 0
        if c.raw and (cmd >> 8) & 0xFF != abi.DRM_IOCTL_TYPE:
            return None
        nr = cmd & 0xFF if c.raw else c.nr
        rdev = os.stat(c.path).st_rdev
        vendor = self._by_node.get(abi.dev_t(os.major(rdev), os.minor(rdev)))
        if vendor is None:
            return None
        slot = vendor if abi.DRM_COMMAND_BASE <= nr < abi.DRM_COMMAND_END else abi.VENDOR_CORE
        kind = self._ioctls.get(abi.ioctl_index(slot, nr), 0)
        return (cgroup_id, abi.dev_t(os.major(rdev), os.minor(rdev)), kind) if kind else None

    def report(self) -> list[dict]:
        """Every key whose cgroup still exists, with its calls and errors, for the host."""
        return [
            {
                "key": list(key),
                "calls": n,
                "errors": {e: m for (*k, e), m in self.errors.items() if tuple(k) == key},
            }
            for key, n in sorted(self.calls.items())
        ]


# include/uapi/linux/bpf.h
MAP_GET_NEXT_ID, LINK_GET_NEXT_ID, _MAP_GET_FD_BY_ID, _OBJ_GET_INFO_BY_FD = 12, 31, 14, 15


def object_ids(get_next_id: int) -> Iterator[int]:
    """The id of every BPF object of one kind in the kernel (what `bpftool map/link list`
    walks): BPF_MAP_GET_NEXT_ID, BPF_LINK_GET_NEXT_ID, ..."""
    object_id = 0
    while True:
        attr = bpfsys._attr("=III", object_id, 0, 0)
        try:
            bpfsys._bpf(get_next_id, attr, "listing BPF objects")
        except bpfsys.BpfError as err:
            if err.errno == 2:
                return
            raise
        object_id = int.from_bytes(bytes(attr)[4:8], sys.byteorder)
        yield object_id


def kernel_durations() -> list[dict]:
    """The `durations` map of the loaded probe (found by name and value size), as the host
    reads it: every key with its sum, slots and errors. Empty if no program has one."""
    for map_id in object_ids(MAP_GET_NEXT_ID):
        try:
            attr = bpfsys._attr("=III", map_id, 0, 0)
            fd = bpfsys._bpf(_MAP_GET_FD_BY_ID, attr, "opening a map")
        except bpfsys.BpfError:
            continue  # freed meanwhile
        try:
            info = ctypes.create_string_buffer(80)
            bpfsys._bpf(
                _OBJ_GET_INFO_BY_FD,
                bpfsys._attr("=IIQ", fd, len(info), bpfsys._addr(info)),
                "map info",
            )
            name = info.raw[24:40].split(b"\0")[0].decode()
            if name == abi.DURATIONS and bpfsys.map_shape(fd).value_size == abi.DURATION_VALUE.size:
                found = Maps({abi.DURATIONS: fd}).read_durations()
                return [
                    {
                        "key": [k.cgroup_id, abi.dev_t(k.major, k.minor), k.kind],
                        "sum_ns": d.sum_ns,
                        "slots": list(d.slots),
                        "errors": dict(zip(abi.ERRORS, d.errors, strict=True)),
                    }
                    for k, d in found.items()
                ]
        finally:
            os.close(fd)
    return []
