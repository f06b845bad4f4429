// SPDX-License-Identifier: GPL-2.0
/*
 * KubeNPU kernel side (BCC dialect).
 *
 * The probe runs at the entry of one of two hooks (`probe.hook`):
 * - drm_ioctl, the function every DRM and accel driver's ioctls pass through (drm.ko);
 * - security_file_ioctl (+ security_file_ioctl_compat where the kernel has it: 32-bit callers
 *   since 6.8 and its stable backports), the LSM hook in vmlinux that every ioctl on the node
 *   passes before the driver sees it. The filter below must stay cheap: it runs for all of them.
 * The kernel keeps only DRM-type calls on known devices whose ioctl nr is in that vendor's table.
 *
 * Two probe modes (`probe.mode`), chosen at compile time:
 * - KUBENPU_AGGREGATE (the default, `aggregate`): calls are counted in a per-CPU hash keyed by
 *   {cgroup, device, kind}, and the ring buffer carries only the first call of each key, so user
 *   space can resolve a new cgroup at once while reading the counts on its own schedule;
 * - without it (`events`): every kept call is one ring-buffer record.
 *
 * In both modes a second program, on the cgroup_mkdir tracepoint, sends {new cgroup id, parent id}
 * so user space can index a cgroup before it is removed (a container that makes one call and exits).
 *
 * One source, two builds (dialect.h): a CO-RE object compiled ahead of time (`make bpf`: one per
 * probe mode, loaded by kubenpu/kernel/core.py) and BCC text compiled on the node, the fallback
 * (kubenpu/kernel/bcc.py). Every name and number user space must agree on is mirrored in
 * kubenpu/kernel/abi.py, and tests/test_abi.py checks the two against each other.
 *
 * BCC: Python replaces the marker line below with the attach line of each hooked function
 * (MODULE_KFUNC_PROBE, KFUNC_PROBE or a kprobe) and repeats that probe; -DKUBENPU_KPROBE makes
 * the field reads explicit probe reads. CO-RE: the object holds one fentry program per hookable
 * function, and the loader autoloads only the hook's. User space fills `minors`, `devices` and
 * `ioctls` before attaching.
 */
#include "dialect.h"

#define DRM_IOCTL_TYPE 'd'
#define DRM_COMMAND_BASE 0x40
#define DRM_COMMAND_END 0xA0
#define VENDOR_CORE 0   /* the DRM core table applies to every vendor */

struct event {
    u64 ts_ns;
    u64 cgroup_id;
    u32 tgid;
    u32 cmd;
    u32 major;
    u32 minor;
    u32 kind;
    u32 _pad;
};

/* A new cgroup. 16 bytes, so user space tells it from a 40-byte struct event by size alone. */
struct birth {
    u64 cgroup_id;
    u64 parent_id;
};

/* The device table, in two parts. `minors`: the DRM (major 226) and accel (major 261) nodes with a
 * minor below 256, every node of a usual machine, in an array the verifier inlines: slot
 * (major == 261) << 8 | minor -> vendor id + 1 (0: not counted). `devices`: any other node,
 * kernel dev_t (MKDEV: major << 20 | minor) -> vendor id (a hash, looked up only for those).
 * Both values hold the device's NUMA node + 1 from bit DEVICE_NODE_SHIFT (0: the device has no
 * node, and none of its calls is remote): the placement count needs no lookup of its own. */
#define DEVICE_NODE_SHIFT 16
#define DEVICE_VENDOR_MASK 0xffff
#define DRM_MAJOR 226
#define ACCEL_MAJOR 261
#define MINOR_SLOTS 256
DECLARE_ARRAY(minors, u32, 2 * MINOR_SLOTS);
DECLARE_HASH(devices, u32, u32, 256);
/* vendor id << 8 | nr -> kind (0 not counted, 1 submit, 2 alloc, 3 wait): an array, which the
 * verifier inlines as it does `minors`, so a call on a DRM or accel node makes no hash lookup
 * before the count (a node of another major: one, in `devices`). */
#define VENDOR_SLOTS 64
DECLARE_ARRAY(ioctls, u32, VENDOR_SLOTS * 256);
DECLARE_RINGBUF(events, RINGBUF_PAGES);
/* What went wrong, by index; user space reads the slots in this order (kubenpu/events.py
 * KERNEL_LOST) and reports increments:
 * [0] ringbuf_full: events mode, the ring buffer had no room: a call is lost;
 * [1] map_full: aggregate mode, the counts map had no room for a new key: a call is lost;
 * [2] late_sighting: no room to announce a new key (aggregate mode) or a new cgroup (a birth,
 *     both modes): no call is lost, the cgroup is only resolved later, from a walk of the tree,
 *     instead of at once (a self-metric);
 * [3] handover: a call made while this program took over from a pinned one (gate HANDOVER):
 *     counted once by the retiring program or not at all (docs/pinning.md);
 * [4] untimed: a counted call whose duration was not kept (`durations` had no room for a new
 *     key, or no task storage for the entry). */
DECLARE_PERCPU_ARRAY(lost, u64, 5);
#define LOST_RINGBUF_FULL 0
#define LOST_MAP_FULL 1
#define LOST_LATE_SIGHTING 2
#define LOST_HANDOVER 3
#define LOST_UNTIMED 4

/* Whether this program counts (docs/pinning.md, hand-over): user space sets it.
 * CLOSED while a pinned program it replaces still counts, HANDOVER while that one is detached,
 * OPEN once it is gone. A program that no pinning hands over is filled OPEN before attach.
 * GATE_TIMED, a bit beside the state: counted calls are timed (probe.durations; CO-RE aggregate
 * mode only). One value, read once per counted call: the gate and the timing switch were two
 * array reads. */
DECLARE_ARRAY(gate, u32, 1);
#define GATE_CLOSED 0
#define GATE_OPEN 1
#define GATE_HANDOVER 2
#define GATE_STATE 3
#define GATE_TIMED 4

#ifdef KUBENPU_AGGREGATE
#define RINGBUF_FAILURE LOST_LATE_SIGHTING
#else
#define RINGBUF_FAILURE LOST_RINGBUF_FULL
#endif

#ifdef KUBENPU_AGGREGATE
struct count_key {
    u64 cgroup_id;
    u32 rdev;
    u32 kind;
};
/* A key's calls, and those of them made from a CPU on another NUMA node than the device's
 * (docs/placement.md): one value, bumped in the same update. */
struct count_value {
    u64 calls;
    u64 remote;
};
DECLARE_PERCPU_HASH(counts, struct count_key, struct count_value, COUNTS_ENTRIES);
#endif

/* Durations and return values (docs/latency.md): aggregate mode, CO-RE only. The counting entry
 * keeps {ts, key} in the task's storage (no hash insert and delete per call, and it goes with the
 * task); an exit program adds the call to `durations`. The value is shared by the CPUs and added
 * to atomically: per CPU it would be 976 B x CPUs x keys (125 MB at 128 CPUs, 1,000 keys). */
#if defined(KUBENPU_AGGREGATE) && !defined(KUBENPU_BCC)
#define KUBENPU_DURATIONS
#include "slots.h"
#define ERROR_SLOTS 15
struct start {
    u64 ts_ns;
    u64 cgroup_id;
    u32 rdev;
    u32 kind;
    u32 cmd;  /* with rdev, what drm_ioctl's exit matches: see kubenpu_drm_exit */
    u32 _pad;
};
struct durations {
    u64 sum_ns;
    u64 slots[DURATION_SLOTS];
    u64 errors[ERROR_SLOTS];
};
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct start);
} starts SEC(".maps");
DECLARE_HASH(durations, struct count_key, struct durations, DURATIONS_ENTRIES);
/* The zero value a new key is inserted from (976 B: more than the BPF stack holds). */
DECLARE_ARRAY(template, struct durations, 1);
#endif

#include "map_calls.h"

/* The vendor id of a counted device into *vendor, its NUMA node + 1 (0: none) into *node; 0 for
 * any other device. */
static __always_inline int other_device(u32 rdev, u32 *vendor, u32 *node)
{
    u32 *found = other_vendor(&rdev);
    if (!found)
        return 0;
    *vendor = *found & DEVICE_VENDOR_MASK;
    *node = *found >> DEVICE_NODE_SHIFT;
    return 1;
}

static __always_inline int device_vendor(u32 rdev, u32 *vendor, u32 *node)
{
    u32 major = rdev >> 20, minor = rdev & 0xfffff;
    u32 index;
    /* Each major tested once, on the hot path of a DRM call. */
    if (major == DRM_MAJOR)
        index = minor;
    else if (major == ACCEL_MAJOR)
        index = MINOR_SLOTS | minor;
    else
        return other_device(rdev, vendor, node);
    if (minor >= MINOR_SLOTS)
        return other_device(rdev, vendor, node);
    u32 *found = minor_vendor(&index);
    if (!found || !(*found & DEVICE_VENDOR_MASK))
        return 0;
    *vendor = (*found & DEVICE_VENDOR_MASK) - 1;
    *node = *found >> DEVICE_NODE_SHIFT;
    return 1;
}

#ifdef KUBENPU_AGGREGATE
/* Whether this call runs on a CPU of another NUMA node than its device's (node: the device's
 * node + 1, 0 for none). */
static __always_inline u64 remote_call(u32 node)
{
    return node && node - 1 != (u32)bpf_get_numa_node_id();
}
#endif

static __always_inline void count_lost(u32 reason)
{
    u64 *n = lost_slot(&reason);
    if (n)
        (*n)++;
}

static __always_inline void emit(u64 cgroup_id, u32 rdev, u32 cmd, u32 kind)
{
    struct event *e = ring_reserve(sizeof(*e));
    if (!e) {
        count_lost(RINGBUF_FAILURE);
        return;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->cgroup_id = cgroup_id;
    e->tgid = bpf_get_current_pid_tgid() >> 32;
    e->cmd = cmd;
    e->major = rdev >> 20;
    e->minor = rdev & 0xfffff;
    e->kind = kind;
    e->_pad = 0;
    ring_submit(e);
}

#ifdef KUBENPU_DURATIONS
static __always_inline void start_timing(u32 gate, struct count_key *key, u32 cmd)
{
    if (!(gate & GATE_TIMED))
        return;
    struct start *s = bpf_task_storage_get(&starts, bpf_get_current_task_btf(), 0,
                                           BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!s) {
        count_lost(LOST_UNTIMED);
        return;
    }
    s->cgroup_id = key->cgroup_id;
    s->rdev = key->rdev;
    s->kind = key->kind;
    s->cmd = cmd;
    s->ts_ns = bpf_ktime_get_ns();  /* last: the exit reads a call once ts_ns is set */
}

/* abi.ERRORS' slot of an errno (a positive number). */
static __always_inline u32 error_slot(long err)
{
    switch (err) {
    case 4: case 512: case 513: case 514: case 516: return 0;  /* EINTR, ERESTART* */
    case 11: return 1;   /* EAGAIN */
    case 62: return 2;   /* ETIME */
    case 110: return 3;  /* ETIMEDOUT */
    case 12: return 4;   /* ENOMEM */
    case 28: return 5;   /* ENOSPC */
    case 22: return 6;   /* EINVAL */
    case 2: return 7;    /* ENOENT */
    case 14: return 8;   /* EFAULT */
    case 1: return 9;    /* EPERM */
    case 13: return 10;  /* EACCES */
    case 5: return 11;   /* EIO */
    case 19: return 12;  /* ENODEV */
    case 125: return 13; /* ECANCELED */
    default: return ERROR_SLOTS - 1;  /* other */
    }
}

/* The exit of a call the entry timed: its duration and return value into `durations`. `rdev`
 * and `cmd`, where the exit has them, must be the entry's: see kubenpu_drm_exit. */
static __always_inline int finish_timing(long ret, u32 rdev, u32 cmd)
{
    struct start *s = bpf_task_storage_get(&starts, bpf_get_current_task_btf(), 0, 0);
    if (!s || !s->ts_ns)
        return 0;
    if (rdev && (s->rdev != rdev || s->cmd != cmd))
        return 0;
    u64 ns = bpf_ktime_get_ns() - s->ts_ns;
    s->ts_ns = 0;
    struct count_key key = {.cgroup_id = s->cgroup_id, .rdev = s->rdev, .kind = s->kind};
    struct durations *d = bpf_map_lookup_elem(&durations, &key);
    if (!d) {
        u32 zero = 0;
        struct durations *blank = bpf_map_lookup_elem(&template, &zero);
        if (blank)
            bpf_map_update_elem(&durations, &key, blank, BPF_NOEXIST);
        d = bpf_map_lookup_elem(&durations, &key);  /* ours, or another CPU's insert */
        if (!d) {
            count_lost(LOST_UNTIMED);
            return 0;
        }
    }
    __sync_fetch_and_add(&d->sum_ns, ns);
    u32 slot = duration_slot(ns);
    if (slot < DURATION_SLOTS)
        __sync_fetch_and_add(&d->slots[slot], 1);
    if (ret < 0) {
        u32 e = error_slot(-ret);
        if (e < ERROR_SLOTS)
            __sync_fetch_and_add(&d->errors[e], 1);
    }
    return 0;
}
#elif defined(KUBENPU_AGGREGATE)
static __always_inline void start_timing(u32 gate, struct count_key *key, u32 cmd) {}
#endif

static __always_inline int handle(u32 rdev, u32 cmd)
{
    /* The caller has checked the type byte ('d'). */
    u32 vendor, node;
    if (!device_vendor(rdev, &vendor, &node))
        return 0;

    u32 nr = cmd & 0xff;
    u32 slot = (nr >= DRM_COMMAND_BASE && nr < DRM_COMMAND_END) ? vendor : VENDOR_CORE;
    u32 index = (slot << 8) | nr;
    u32 *found = ioctl_kind(&index);
    if (!found || !*found)
        return 0;
    u32 kind = *found;

    u32 zero = 0;
    u32 *open = gate_value(&zero);
    if (!open)
        return 0;
    u32 gate = *open;
    if ((gate & GATE_STATE) != GATE_OPEN) {
        if ((gate & GATE_STATE) == GATE_HANDOVER)
            count_lost(LOST_HANDOVER);
        return 0;
    }

    u64 cgroup_id = bpf_get_current_cgroup_id();
#ifdef KUBENPU_AGGREGATE
    struct count_key ck = {.cgroup_id = cgroup_id, .rdev = rdev, .kind = kind};
    u64 remote = remote_call(node);
    struct count_value *n = count_of(&ck);
    if (n) {
        n->calls++;  /* this CPU's slot: no atomics needed */
        n->remote += remote;
        start_timing(gate, &ck, cmd);
        return 0;
    }
    struct count_value one = {.calls = 1, .remote = remote};
    /* First call of this key: only the CPU whose insert wins announces it, so user space
     * hears of each key once. */
    if (count_insert(&ck, &one) != 0) {
        n = count_of(&ck);  /* another CPU inserted it meanwhile */
        if (n) {
            n->calls++;
            n->remote += remote;
            start_timing(gate, &ck, cmd);
        } else {
            count_lost(LOST_MAP_FULL);
        }
        return 0;
    }
    start_timing(gate, &ck, cmd);
#endif
    emit(cgroup_id, rdev, cmd, kind);
    return 0;
}

/* The device of an ioctl's file. fentry (both builds) reads BTF-typed arguments directly; BCC's
 * kprobe fallback has untyped arguments, so it reads through bpf_probe_read_kernel, which
 * lockdown=confidentiality refuses. */
static __always_inline u32 file_rdev(struct file *filp)
{
#ifdef KUBENPU_KPROBE
    struct inode *inode = 0;
    u32 rdev = 0;
    bpf_probe_read_kernel(&inode, sizeof(inode), &filp->f_inode);
    bpf_probe_read_kernel(&rdev, sizeof(rdev), &inode->i_rdev);
    return rdev;
#else
    return filp->f_inode->i_rdev;
#endif
}

/* Every hooked function's program. The cmd type test comes first, before any memory is read: on
 * the LSM hook nearly every call (TCGETS, socket ioctls, ...) leaves here. */
static __always_inline int on_ioctl(struct file *filp, unsigned int cmd)
{
    if (((cmd >> 8) & 0xff) != DRM_IOCTL_TYPE)
        return 0;
    return handle(file_rdev(filp), cmd);
}

#ifdef KUBENPU_BCC
/* Repeated by Python once per hooked function, up to its closing brace. */
KUBENPU_ATTACH
{
    return on_ioctl(filp, cmd);
}
#else
SEC("fentry/security_file_ioctl")
int BPF_PROG(kubenpu_lsm_ioctl, struct file *filp, unsigned int cmd, unsigned long arg)
{
    return on_ioctl(filp, cmd);
}

/* 32-bit callers, since 6.8 and its stable backports; the loader leaves it out where absent. */
SEC("fentry/security_file_ioctl_compat")
int BPF_PROG(kubenpu_lsm_compat, struct file *filp, unsigned int cmd, unsigned long arg)
{
    return on_ioctl(filp, cmd);
}

/* In drm.ko on most distributions: libbpf finds it in the module's BTF (CAP_SYS_ADMIN). */
SEC("fentry/drm_ioctl")
int BPF_PROG(kubenpu_drm_ioctl, struct file *filp, unsigned int cmd, unsigned long arg)
{
    return on_ioctl(filp, cmd);
}

#ifdef KUBENPU_DURATIONS
/* The exits (abi.EXIT_PROGRAMS). The LSM hook returns before the driver runs, so its calls end
 * at the ioctl syscall's return: every ioctl of the node passes there, and leaves at the type
 * test, as at the entry. The syscall's argument registers, and a kretprobe's return register,
 * are arch-specific. */
#if defined(__TARGET_ARCH_x86)
#define SYSCALL_CMD(regs) ((regs)->si)
#define COMPAT_CMD(regs) ((regs)->cx)
#define SYS_EXIT "fexit/__x64_sys_ioctl"
#define COMPAT_EXIT "fexit/__ia32_compat_sys_ioctl"
#define RETURN_VALUE(regs) ((regs)->ax)
#elif defined(__TARGET_ARCH_arm64)
#define SYSCALL_CMD(regs) ((regs)->regs[1])
#define COMPAT_CMD(regs) ((regs)->regs[1])
#define SYS_EXIT "fexit/__arm64_sys_ioctl"
#define COMPAT_EXIT "fexit/__arm64_compat_sys_ioctl"
#define RETURN_VALUE(regs) ((regs)->regs[0])
#endif

#ifdef SYS_EXIT
static __always_inline int on_exit(unsigned long cmd, long ret)
{
    if (((cmd >> 8) & 0xff) != DRM_IOCTL_TYPE)
        return 0;
    return finish_timing(ret, 0, 0);  /* the call's own syscall: nothing to match */
}

SEC(SYS_EXIT)
int BPF_PROG(kubenpu_sys_exit, const struct pt_regs *regs, long ret)
{
    return on_exit(SYSCALL_CMD(regs), ret);
}

SEC(COMPAT_EXIT)
int BPF_PROG(kubenpu_compat_exit, const struct pt_regs *regs, long ret)
{
    return on_exit(COMPAT_CMD(regs), ret);
}
#endif

/* drm_ioctl's exit, which DRM calls alone pass: the drm_ioctl hook's, and the LSM hook's by
 * default (probe.durations_exit). Behind the LSM hook a counted call may end before drm_ioctl (an
 * LSM refuses it, a driver's wrapper fails first): its start stays until the task's next counted
 * call. Matching the device and request keeps another call, one not counted, from ending it. */
SEC("fexit/drm_ioctl")
int BPF_PROG(kubenpu_drm_exit, struct file *filp, unsigned int cmd, unsigned long arg, long ret)
{
    if (((cmd >> 8) & 0xff) != DRM_IOCTL_TYPE)
        return 0;
    return finish_timing(ret, file_rdev(filp), cmd);
}

/* drm_ioctl's return where fexit cannot reach it (in drm.ko, whose BTF needs CAP_SYS_ADMIN): a
 * perf-event kretprobe needs CAP_BPF + CAP_PERFMON alone, and DRM calls alone pass it too. The
 * return value is a direct read of the context's register (no bpf_probe_read, which
 * lockdown=confidentiality refuses). The arguments are gone by then, so nothing is matched: a
 * counted call that ended before drm_ioctl leaves its start for the task's next call through
 * drm_ioctl, counted or not, to end (docs/latency.md). */
#ifdef RETURN_VALUE
SEC("kretprobe/drm_ioctl")
int kubenpu_drm_return(struct pt_regs *ctx)
{
    return finish_timing((long)RETURN_VALUE(ctx), 0, 0);
}
#endif
#endif
#endif

/* tp_btf/cgroup_mkdir. BCC cannot load a tp_btf program itself, so the BCC loader loads this one
 * from BCC's compiled instructions. Every field is a direct BTF load (no bpf_probe_read), which
 * lockdown=confidentiality allows. The ids are kernfs node ids, i.e. bpf_get_current_cgroup_id()
 * and the directory's inode number; the parent is found through the css, whose layout is the same
 * in 6.1 and 7.3 (kernfs_node's parent field was renamed in 6.15). */
TRACING_PROG("tp_btf/cgroup_mkdir", kubenpu_cgroup_mkdir, struct cgroup *cgrp, const char *path)
{
    /* Only the unified (v2) hierarchy, id 0: v1 hierarchies number their nodes separately. */
    if (cgrp->root->hierarchy_id != 0)
        return 0;
    struct cgroup_subsys_state *parent = cgrp->self.parent;
    if (!parent)
        return 0;
    struct birth *b = ring_reserve(sizeof(*b));
    if (!b) {
        count_lost(LOST_LATE_SIGHTING);  /* no call is lost: the cgroup is left to a walk */
        return 0;
    }
    b->cgroup_id = cgrp->kn->id;
    b->parent_id = parent->cgroup->kn->id;
    ring_submit(b);
    return 0;
}
