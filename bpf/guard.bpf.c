// SPDX-License-Identifier: GPL-2.0
/*
 * KubeNPU access guard (docs/guard.md): BPF LSM programs that allow or block a pod's getting an
 * fd of an accelerator device node (its open, or its receipt over a unix socket or pidfd_getfd)
 * and, opt-in (guard.ioctl), each ioctl on one. CO-RE only, loaded by kubenpu/kernel/guard.py.
 *
 * The decision, for a char device inode whose dev_t is in `guarded` and a task in cgroup C:
 *   C not in `pods`: allowed. If C is under the kubepods cgroup (config: its id and level) the
 *     pod is one the agent has not seen yet: counted `unseen` (never denied for a late agent);
 *     a host process (the kubelet, a display server) is not counted at all.
 *   pod mode off: allowed, not counted.
 *   {pod, device} in `allowed`: counted `allowed`.
 *   the agent's heartbeat older than fail_open_ns: allowed, counted `failed_open`.
 *   audit: allowed, counted `audited` (a would-be denial); enforce: counted `denied`, -EPERM.
 * Every name and number here is mirrored in kubenpu/kernel/guard.py.
 */
#include "dialect.h"

#define EPERM 1
#define S_IFMT 00170000
#define S_IFCHR 0020000

#define MODE_OFF 0
#define MODE_AUDIT 1
#define MODE_ENFORCE 2

#define OP_OPEN 0
#define OP_IOCTL 1
#define OP_RECEIVE 2

#define VERDICT_ALLOWED 0
#define VERDICT_DENIED 1
#define VERDICT_AUDITED 2
#define VERDICT_FAILED_OPEN 3
#define VERDICT_UNSEEN 4

struct guard_config {
    u64 heartbeat_ns;   /* the agent's CLOCK_MONOTONIC at its last policy write; 0: never */
    u64 fail_open_ns;   /* a heartbeat older than this lets everything through */
    u64 kubepods_id;    /* the cgroup id of kubepods(.slice); 0: unknown, nothing is `unseen` */
    u32 kubepods_level; /* its level in the cgroup v2 tree (the root is 0) */
    u32 _pad;
};

struct pod {
    u32 pod;  /* the agent's number for the pod (all its containers' cgroups share it) */
    u32 mode; /* MODE_*: the global mode or the pod's namespace's */
};

struct access {
    u32 pod;
    u32 dev; /* kernel dev_t: major << 20 | minor */
};

struct tally_key {
    u64 cgroup_id;
    u32 dev;
    u8 op;
    u8 verdict;
    u16 _pad;
};

DECLARE_ARRAY(guard_config, struct guard_config, 1);
DECLARE_HASH(guarded, u32, u8, 1024);
DECLARE_HASH(pods, u64, struct pod, 65536);
DECLARE_HASH(allowed, struct access, u8, 65536);
DECLARE_MAP(tally, BPF_MAP_TYPE_LRU_HASH, struct tally_key, u64, 65536);

static __always_inline void count(u64 cgroup_id, u32 dev, u8 op, u8 verdict)
{
    struct tally_key key = {.cgroup_id = cgroup_id, .dev = dev, .op = op, .verdict = verdict};
    u64 one = 1;
    u64 *n = bpf_map_lookup_elem(&tally, &key);
    if (n)
        __sync_fetch_and_add(n, 1);
    else if (bpf_map_update_elem(&tally, &key, &one, BPF_NOEXIST))
        /* a racing first count inserted it */
        if ((n = bpf_map_lookup_elem(&tally, &key)))
            __sync_fetch_and_add(n, 1);
}

static __always_inline int decide(struct file *file, u8 op)
{
    struct inode *inode = file->f_inode;
    if (!inode || (inode->i_mode & S_IFMT) != S_IFCHR)
        return 0;
    u32 dev = inode->i_rdev;
    if (!bpf_map_lookup_elem(&guarded, &dev))
        return 0;
    u32 zero = 0;
    struct guard_config *cfg = bpf_map_lookup_elem(&guard_config, &zero);
    if (!cfg)
        return 0;
    u64 cgroup_id = bpf_get_current_cgroup_id();
    struct pod *pod = bpf_map_lookup_elem(&pods, &cgroup_id);
    if (!pod) {
        if (cfg->kubepods_id &&
            bpf_get_current_ancestor_cgroup_id(cfg->kubepods_level) == cfg->kubepods_id)
            count(cgroup_id, dev, op, VERDICT_UNSEEN);
        return 0;
    }
    if (pod->mode == MODE_OFF)
        return 0;
    struct access access = {.pod = pod->pod, .dev = dev};
    if (bpf_map_lookup_elem(&allowed, &access)) {
        count(cgroup_id, dev, op, VERDICT_ALLOWED);
        return 0;
    }
    u64 beat = cfg->heartbeat_ns;
    if (!beat || bpf_ktime_get_ns() - beat > cfg->fail_open_ns) {
        count(cgroup_id, dev, op, VERDICT_FAILED_OPEN);
        return 0;
    }
    if (pod->mode == MODE_AUDIT) {
        count(cgroup_id, dev, op, VERDICT_AUDITED);
        return 0;
    }
    count(cgroup_id, dev, op, VERDICT_DENIED);
    return -EPERM;
}

/* Each hook first keeps an earlier LSM's refusal (ret). */
SEC("lsm/file_open")
int BPF_PROG(guard_file_open, struct file *file, int ret)
{
    return ret ? ret : decide(file, OP_OPEN);
}

/* An fd received (receive_fd: SCM_RIGHTS over a unix socket, pidfd_getfd). A refusal drops the
 * fd: recvmsg returns the data with MSG_CTRUNC and no fd from this one on. */
SEC("lsm/file_receive")
int BPF_PROG(guard_file_receive, struct file *file, int ret)
{
    return ret ? ret : decide(file, OP_RECEIVE);
}

/* Opt-in (guard.ioctl): runs on every ioctl of every process on the node, so it costs every
 * ioctl the trampoline's entry (docs/performance.md); it also stops an fd held from before the
 * policy or carried in by a cgroup move, which the open and receive checks never see. */
SEC("lsm/file_ioctl")
int BPF_PROG(guard_file_ioctl, struct file *file, unsigned int cmd, unsigned long arg, int ret)
{
    return ret ? ret : decide(file, OP_IOCTL);
}

/* 32-bit callers, since 6.8 (and its stable backports); loaded only where the kernel has it. */
SEC("lsm/file_ioctl_compat")
int BPF_PROG(guard_file_ioctl_compat, struct file *file, unsigned int cmd, unsigned long arg,
             int ret)
{
    return ret ? ret : decide(file, OP_IOCTL);
}
