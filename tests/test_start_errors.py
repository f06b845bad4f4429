"""The line a failed start prints names the real cause first (docs/core.md, Troubleshooting), and
mentions BCC only where `probe.loader` allows it and kernel headers would help.

Each cause is made for real where the host allows it: the host's own libbpf on a real object, a
mount namespace without /sys/kernel/btf (no BTF), a process without capabilities (setpriv), a
stub libbpf.so.1 built here that lacks a function the loader calls (an old libbpf), the real
agent's exit code and output. Lockdown cannot be turned on here: its row fakes the lockdown level
and BCC's refusal (the text the VM's lockdown kernel gives, tests/test_e2e_vm.py checks it there).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubenpu.discovery import discover
from kubenpu.kernel import bcc, hooks
from kubenpu.kernel.bcc import BccKernel
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.errors import Cause, ProbeError

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ROOT / "tests" / "testdata" / "vgem-platform"
HOOK = hooks.DEFAULT_HOOK
CORE_DOC = (ROOT / "docs" / "core.md").read_text()
# What BCC says when lockdown=confidentiality refuses the kprobe attach's reads (the kernel's
# verifier message, seen in the VM's lockdown run).
BCC_LOCKDOWN = "Failed to load BPF program b'kprobe__kubenpu': Permission denied"
# Builds and starts a CO-RE kernel in a fresh process; prints the failure as JSON.
START = """
import json, sys
from kubenpu.discovery import discover
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.errors import ProbeError
kernel = CoreKernel(discover(sys.argv[1]), alone=True)
try:
    kernel.start(lambda record: None)
except ProbeError as err:
    print(json.dumps({"cause": err.cause.name, "line": str(err)}))
"""
# Runs a command under a seccomp filter that refuses bpf() with EPERM, as a runtime's
# RuntimeDefault profile that predates CAP_BPF does to a process without CAP_SYS_ADMIN.
NO_BPF_FILTER = r"""
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_bpf, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 111;
    execvp(argv[1], argv + 1);
    return 112;
}
"""
STUB_LIBBPF = (
    "int bpf_object__open_file(void) { return 0; }\nint libbpf_set_print(void) { return 0; }\n"
)


def start_elsewhere(wrapper: list[str], env: dict[str, str] | None = None) -> tuple[str, str]:
    """(cause, line) of a CO-RE start in a new process run under `wrapper`."""
    argv = [*wrapper, sys.executable, "-c", START, str(MACHINE)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    if done.returncode and "unshare" in wrapper[:1]:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    failure = json.loads(done.stdout)
    return failure["cause"], failure["line"]


def start_here(kernel) -> tuple[str, str]:
    with pytest.raises(ProbeError) as failed:
        kernel.start(lambda record: None)
    return failed.value.cause.name, str(failed.value)


@pytest.fixture
def stub_libbpf(tmp_path: Path) -> Path:
    """A directory holding a libbpf.so.1 that has two of the functions the loader calls."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the stub libbpf")
    source = tmp_path / "stub.c"
    source.write_text(STUB_LIBBPF)
    lib = tmp_path / "lib"
    lib.mkdir()
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libbpf.so.1", "-o", lib / "libbpf.so.1", source],
        check=True,
    )
    return lib


def no_btf() -> tuple[str, str]:
    """libbpf looks for the kernel's BTF in /sys/kernel/btf/vmlinux (then in /boot and
    /lib/modules, which this host lacks): an empty tmpfs over it is a kernel without BTF."""
    hide = 'mount -t tmpfs none /sys/kernel/btf && exec "$@"'
    return start_elsewhere(["unshare", "-m", "sh", "-c", hide, "sh"])


def no_capabilities() -> tuple[str, str]:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv")
    return start_elsewhere(["setpriv", "--bounding-set=-all", "--inh-caps=-all"])


def seccomp_refuses_bpf(tmp_path: Path) -> tuple[str, str]:
    """Every capability held, bpf() refused with EPERM by a seccomp filter: the kernel refuses,
    not the capabilities (the line once sent this to "no capabilities")."""
    if hooks.missing_privileges(HOOK, hooks.effective_capabilities()):
        pytest.skip("this test runs without the hook's capabilities")
    source, wrapper = tmp_path / "no_bpf.c", tmp_path / "no_bpf"
    source.write_text(NO_BPF_FILTER)
    subprocess.run([shutil.which("cc") or "cc", "-o", wrapper, source], check=True)
    return start_elsewhere([str(wrapper)])


def lockdown(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    def refused(self, plan):
        raise Exception(BCC_LOCKDOWN)  # BCC raises bare Exception

    monkeypatch.setattr(hooks, "lockdown", lambda: "confidentiality")
    monkeypatch.setattr(BccKernel, "_load", refused)
    return start_here(BccKernel(discover(MACHINE), attach="kprobe"))


# cause -> (what the line starts with after "cannot attach to HOOK: ", what it must contain)
TABLE = {
    "no capabilities": (
        Cause.CAPABILITIES,
        "core: missing CAP_BPF, CAP_PERFMON (probe.hook security_file_ioctl needs",
        ["loading the object", "EPERM"],
    ),
    "refused with every capability": (
        Cause.REFUSED,
        "core: refused although the agent holds CAP_BPF + CAP_PERFMON: a seccomp filter",
        ["seccompProfile: {type: Unconfined}", "kernel that does not allow fentry", "EPERM"],
    ),
    "no BTF": (
        Cause.NO_BTF,
        "core: the kernel has no BTF",
        ["libbpf: failed to find valid kernel BTF", "ESRCH", "bccFallback: true"],
    ),
    "lockdown": (
        Cause.LOCKDOWN,
        "kprobe: kernel lockdown (confidentiality) refuses the bpf_probe_read",
        ["probe.attach: fentry", BCC_LOCKDOWN],
    ),
    "missing object": (
        Cause.OBJECT_MISSING,
        "core: the CO-RE object",
        ["is missing (build it with `make bpf`)"],
    ),
    "corrupt object": (
        Cause.OBJECT_CORRUPT,
        "core: opening",
        ["is not a proper ELF object", "LIBBPF_ERRNO__FORMAT: BPF object format invalid"],
    ),
    "old libbpf": (
        Cause.OLD_LIBBPF,
        "core: ",
        ["libbpf.so.1 lacks bpf_object__find_map_by_name", "libbpf 1.0 and later"],
    ),
}


@pytest.mark.parametrize("case", TABLE)
def test_each_cause_is_named_first(case, tmp_path, monkeypatch, stub_libbpf):
    devices = discover(MACHINE)
    garbage = tmp_path / "garbage.bpf.o"
    garbage.write_bytes(bytes(range(256)) * 4)  # no ELF header
    env = {"LD_LIBRARY_PATH": str(stub_libbpf), "PATH": "/usr/bin:/bin"}
    run = {
        "no capabilities": no_capabilities,
        "refused with every capability": lambda: seccomp_refuses_bpf(tmp_path),
        "no BTF": no_btf,
        "lockdown": lambda: lockdown(monkeypatch),
        "missing object": lambda: start_here(
            CoreKernel(devices, path=tmp_path / "missing.bpf.o", alone=True)
        ),
        "corrupt object": lambda: start_here(CoreKernel(devices, path=garbage, alone=True)),
        "old libbpf": lambda: start_elsewhere([], env),
    }[case]
    cause, line = run()
    print(f"{case}: {line}")  # the lines, for the record (pytest -s)
    want, lead, contains = TABLE[case]
    assert cause == want.name, line
    assert line.startswith(f"cannot attach to {HOOK}: {lead}"), line
    assert [c for c in contains if c not in line] == [], line
    assert "Unknown error" not in line
    assert lead in CORE_DOC  # docs/core.md's table quotes each line
    if case != "lockdown":  # probe.loader core: BCC only where the kernel's limits need it
        bcc_helps = case in ("no BTF", "refused with every capability")
        assert ("BCC" in line or "bccFallback" in line) == bcc_helps, line


def agent(tmp_path: Path, loader: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    cfg = tmp_path / f"{loader}.yaml"
    cfg.write_text(
        f"node_name: n1\ndiscovery:\n  root: {MACHINE}\n"
        f"probe:\n  loader: {loader}\n  pin_dir: ''\n"
        "export:\n  prometheus:\n    enabled: false\n"
    )
    argv = [sys.executable, "-m", "kubenpu.agent", "--config", str(cfg)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_an_old_libbpf_is_one_line_and_exit_2_and_auto_falls_back_to_bcc(tmp_path, stub_libbpf):
    """Issue 32: a libbpf.so.1 that lacks a function the loader calls gave a 31-line traceback
    and exit 1, and no fallback under probe.loader: auto."""
    env = {"LD_LIBRARY_PATH": str(stub_libbpf), "PATH": "/usr/bin:/bin"}
    core = agent(tmp_path, "core", env)
    assert core.returncode == 2, core.stderr
    assert "Traceback" not in core.stderr + core.stdout
    (error,) = [line for line in core.stderr.splitlines() if " ERROR " in line]
    assert f"cannot attach to {HOOK}: core: " in error and "lacks bpf_" in error
    auto = agent(tmp_path, "auto", env)
    assert "Traceback" not in auto.stderr + auto.stdout
    assert "the CO-RE object did not load, falling back to BCC: " in auto.stderr
    # BCC is not installed on this host: its failure follows the CO-RE cause on the one line.
    (error,) = [line for line in auto.stderr.splitlines() if " ERROR " in line]
    assert error.index("lacks bpf_") < error.index("BCC fallback: "), error
    assert auto.returncode == 2


def test_without_capabilities_auto_does_not_try_bcc(monkeypatch):
    """BCC cannot get past missing capabilities: `auto` stops at the CO-RE failure."""
    from kubenpu.kernel.loader import Fallback

    monkeypatch.setattr(hooks, "effective_capabilities", lambda: set())
    tried = []

    class Refused:
        aggregate = True

        def __init__(self, name: str, cause: Cause) -> None:
            self.name, self.cause = name, cause

        def start(self, on_record) -> str:
            tried.append(self.name)
            raise ProbeError(f"cannot attach to {HOOK}: {self.name}: refused", self.cause)

    kernels = [Refused("core", Cause.CAPABILITIES), Refused("bcc", Cause.CAPABILITIES)]
    with pytest.raises(ProbeError, match=r"core: refused$"):
        Fallback(kernels).start(lambda record: None)
    assert tried == ["core"]
    tried.clear()
    kernels = [Refused("core", Cause.NO_BTF), Refused("bcc", Cause.OTHER)]
    with pytest.raises(ProbeError) as failed:
        Fallback(kernels).start(lambda record: None)
    assert tried == ["core", "bcc"]
    assert (
        str(failed.value) == f"cannot attach to {HOOK}: core: refused; BCC fallback: bcc: refused"
    )
    assert failed.value.cause is Cause.NO_BTF


def test_headers_hint_quotes_the_chart_value_as_it_exists():
    """The chart value is top-level `bccFallback` (deploy/helm/kubenpu/values.yaml)."""
    import yaml

    values = yaml.safe_load((ROOT / "deploy/helm/kubenpu/values.yaml").read_text())
    hint = bcc.headers_hint()
    if not hint:
        pytest.skip("this host has kernel headers")
    assert "chart value bccFallback: true" in hint and "bccFallback" in values
