"""The hooks (`probe.hook`), their kernel functions, and the privileges each needs; shared by
both loaders.

- ``drm_ioctl``: the DRM core's ioctl entry, in drm.ko on most distributions. fentry on a module
  function needs the module's BTF object, which only CAP_SYS_ADMIN may look up;
- ``security_file_ioctl``: the LSM hook in vmlinux that every ioctl passes, plus
  security_file_ioctl_compat (32-bit callers) where the kernel has it; before that function
  existed, 32-bit calls passed security_file_ioctl itself. CAP_BPF + CAP_PERFMON suffice.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

DEFAULT_HOOK = "security_file_ioctl"
HOOK_FUNCTIONS = {
    "drm_ioctl": ("drm_ioctl",),
    "security_file_ioctl": ("security_file_ioctl", "security_file_ioctl_compat"),
}
OPTIONAL_FUNCTIONS = {"security_file_ioctl_compat"}  # from 6.8 (and stable backports)

# What each hook needs (measured by tests/test_least_privilege_vm.py): fentry on a module function
# needs the module's BTF object, which the kernel hands out only to CAP_SYS_ADMIN; fentry on a
# vmlinux function needs CAP_BPF (maps, BTF) and CAP_PERFMON (tracing programs).
HOOK_CAPABILITIES = {"drm_ioctl": ("SYS_ADMIN",), "security_file_ioctl": ("BPF", "PERFMON")}
# include/uapi/linux/capability.h
_CAP_BITS = {"SYS_NICE": 23, "SYS_ADMIN": 21, "PERFMON": 38, "BPF": 39}


def kernel_symbols(
    wanted: Collection[str], kallsyms: Path = Path("/proc/kallsyms"), hint: str = ""
) -> set[str]:
    """Which of `wanted` the running kernel has (names are readable without privileges), in one
    pass that ends once all are found: kallsyms has 100,000s of lines and a whole pass took
    1.3 s under TCG, so a caller asks for every name it needs at once (vmlinux's come before
    the modules'). Only the names found are kept (a set of them all is ~12 MiB). `hint`, a
    substring of every wanted name, skips the other lines unsplit."""
    found: set[str] = set()
    if not wanted:
        return found
    with kallsyms.open() as f:
        for line in f:
            if hint in line and len(fields := line.split(maxsplit=3)) > 2 and fields[2] in wanted:
                found.add(fields[2])
                if len(found) == len(wanted):
                    break
    return found


def optional_functions(hook: str) -> set[str]:
    """The hook's functions that some kernels lack: kernel_symbols() tells."""
    return set(HOOK_FUNCTIONS[hook]) & OPTIONAL_FUNCTIONS


def functions(hook: str, present: Collection[str]) -> list[str]:
    """The hook's functions that this kernel has; `present`: kernel_symbols() of at least
    optional_functions(hook)."""
    return [f for f in HOOK_FUNCTIONS[hook] if f not in OPTIONAL_FUNCTIONS or f in present]


def in_module(hook: str, btf_dir: Path = Path("/sys/kernel/btf")) -> bool:
    """Whether the hook's function lives in a module (drm.ko) rather than vmlinux."""
    return hook == "drm_ioctl" and (btf_dir / "drm").exists()


def drm_exit(held: set[str], modules: Path = Path("/sys/module")) -> str:
    """How drm_ioctl's exit can be reached beside another hook: "fexit" where its BTF is
    (built in, vmlinux's; in drm.ko, the module's BTF object, with CAP_SYS_ADMIN), else
    "kretprobe" (a perf-event kprobe: CAP_BPF + CAP_PERFMON); "" with no drm loaded."""
    if not (modules / "drm").exists():
        return ""
    return "fexit" if not in_module("drm_ioctl") or "SYS_ADMIN" in held else "kretprobe"


def effective_capabilities(status: Path = Path("/proc/self/status")) -> set[str]:
    """The capabilities the loaders ask about (_CAP_BITS) that this process holds."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            mask = int(line.split()[1], 16)
            return {name for name, bit in _CAP_BITS.items() if mask >> bit & 1}
    return set()


def missing_privileges(hook: str, held: set[str]) -> str:
    """The capabilities the hook needs and the agent lacks, as the cause of a failed start ("" if
    none): the kernel's refusal varies (a map, the BTF or the program may be refused first)."""
    missing = [c for c in HOOK_CAPABILITIES[hook] if c not in held and "SYS_ADMIN" not in held]
    if not missing:
        return ""
    names = ", ".join(f"CAP_{c}" for c in missing)
    need = " + ".join(f"CAP_{c}" for c in HOOK_CAPABILITIES[hook])
    return f"missing {names} (probe.hook {hook} needs {need}; see docs/deploy.md)"


def module_without_btf(
    hook: str, sys_module: Path = Path("/sys/module"), btf_dir: Path = Path("/sys/kernel/btf")
) -> str:
    """Why fentry cannot reach the hook's function ("" if it can): drm_ioctl in a loaded drm.ko
    that carries no BTF of its own (fentry on a module function needs it)."""
    if hook != "drm_ioctl" or not (sys_module / "drm" / "initstate").exists():
        return ""  # vmlinux's function, or drm built into the kernel (vmlinux's BTF has it)
    if (btf_dir / "drm").exists():
        return ""
    return (
        "drm.ko has no BTF (/sys/kernel/btf/drm is missing: a kernel without "
        "CONFIG_DEBUG_INFO_BTF_MODULES, or a drm.ko built apart from it), and fentry on its "
        "drm_ioctl needs it; use probe.hook security_file_ioctl (the default)"
    )


def refusal(
    hook: str, status: Path = Path("/proc/self/status"), lsm: Path = Path("/proc/self/attr/current")
) -> str:
    """Why the kernel refuses (EPERM) a process that holds every capability the hook needs, as
    far as the process can tell: a seccomp filter, a security module's confinement, else the
    kernel itself (fentry not allowed on the function)."""
    need = " + ".join(f"CAP_{c}" for c in HOOK_CAPABILITIES[hook])
    suspects = []
    if re.search(r"^Seccomp:\s*2$", _read(status), re.MULTILINE):
        suspects.append(
            "a seccomp filter (an old runtime's RuntimeDefault refuses bpf() without "
            "CAP_SYS_ADMIN: chart value seccompProfile: {type: Unconfined})"
        )
    label = _read(lsm).strip("\0\n ")
    if label and not label.startswith("unconfined"):
        suspects.append(f"the security module's confinement ({label[:80]})")
    suspects.append(
        f"a kernel that does not allow fentry on {hook} (no "
        "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS on this architecture; BCC's probe.attach: "
        "kprobe may load)"
    )
    return f"refused although the agent holds {need}: " + ", or ".join(suspects)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def lockdown(path: Path = Path("/sys/kernel/security/lockdown")) -> str:
    """The kernel's lockdown level (none, integrity, confidentiality); "" when it has none."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    level = re.search(r"\[(\w+)\]", text)
    return level[1] if level else ""


def describe(attach: str, functions: list[str], loader: str) -> str:
    """How the probe is attached, for the agent's attach line: `fentry on f1+f2 (core)`."""
    return f"{attach} on {'+'.join(functions)} ({loader})"
