// SPDX-License-Identifier: GPL-2.0
/*
 * KubeNPU placement scheduler (docs/scheduler.md): an opt-in sched_ext scheduler that runs the
 * tasks of a pod using an accelerator on CPUs of that accelerator's NUMA node when one is idle.
 * CO-RE only, loaded by kubenpu/kernel/placement.py; needs a kernel with CONFIG_SCHED_CLASS_EXT
 * and per-node idle tracking (6.15 and later).
 *
 * Partial mode (SCX_OPS_SWITCH_PARTIAL): only tasks whose policy is SCHED_EXT are scheduled here,
 * and the agent sets that policy on the tasks of the pods in `prefer` only. Every other task
 * (the host, the kubelet, the agent itself, kernel threads) stays in the fair class, so a fault
 * here can delay only those pods' tasks, and the kernel's watchdog (timeout_ms) then disables
 * the scheduler and returns them to the fair class.
 *
 * For a task whose cgroup is in `prefer` (cgroup id -> NUMA node):
 *   at a wake-up and whenever it is queued (its slice ended): an idle CPU of the node among the
 *   task's allowed CPUs, claimed, and the task put in that CPU's own queue;
 *   none idle: the shared FIFO queue, with an idle CPU elsewhere kicked to take it
 *   (work-conserving: a busy node never leaves the pod waiting while another CPU idles).
 * Any other SCHED_EXT task: scx_simple's global FIFO (the default CPU choice, the shared queue).
 * No loops, one queue: every CPU serves the shared queue when its own is empty.
 */
#include "dialect.h"

typedef __s32 s32;
typedef _Bool bool;

#define MAX_NODES 64
#define SHARED_DSQ 0
#define SLICE_NS 20000000ULL /* SCX_SLICE_DFL */
#define TIMEOUT_MS 30000 /* the watchdog's stall limit (the kernel's maximum and default) */

/* enum scx_dsq_id_flags, scx_ops_flags, scx_pick_idle_cpu_flags, scx_kick_flags (stable ABI) */
#define SCX_DSQ_LOCAL 0x8000000000000002ULL
#define SCX_DSQ_LOCAL_ON 0xc000000000000000ULL
#define SCX_OPS_ENQ_LAST 2ULL
#define SCX_OPS_SWITCH_PARTIAL 8ULL
#define SCX_OPS_BUILTIN_IDLE_PER_NODE 64ULL
#define SCX_PICK_IDLE_IN_NODE 2ULL
#define SCX_KICK_IDLE 1ULL

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
/* Defined, not declared: libbpf matches a kfunc's pointer arguments by kind (struct vs fwd). */
struct cpumask {
    unsigned long bits[1];
};
struct css_set {
    struct cgroup *dfl_cgrp;
};
struct task_struct {
    const struct cpumask *cpus_ptr;
    struct css_set *cgroups;
};
#pragma clang attribute pop

/* The members set below; libbpf fills the kernel's struct by member name. */
struct sched_ext_ops {
    s32 (*select_cpu)(struct task_struct *p, s32 prev_cpu, u64 wake_flags);
    void (*enqueue)(struct task_struct *p, u64 enq_flags);
    void (*dispatch)(s32 cpu, struct task_struct *prev);
    s32 (*init)(void);
    u64 flags;
    u32 timeout_ms;
    char name[128];
};

/* The kfuncs used, as 7.3's BTF declares them; a kernel without one refuses the load. With
 * per-node idle tracking the node-less idle kfuncs are errors: only the _node ones are used. */
extern s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
extern void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym;
extern bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
extern s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags,
                                  bool *is_idle) __ksym;
extern s32 scx_bpf_pick_idle_cpu_node(const struct cpumask *cpus_allowed, s32 node,
                                      u64 flags) __ksym;
extern void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
extern s32 scx_bpf_task_cpu(const struct task_struct *p) __ksym;
extern int scx_bpf_cpu_node(s32 cpu) __ksym;

DECLARE_HASH(prefer, u64, u32, 65536);

/* The node a task's pod prefers, or -1. The task's cgroup v2 (not current's: select_cpu runs in
 * the waker). */
static __always_inline s32 preferred(struct task_struct *p)
{
    u64 cgroup_id = p->cgroups->dfl_cgrp->kn->id;
    u32 *node = bpf_map_lookup_elem(&prefer, &cgroup_id);
    return node && *node < MAX_NODES ? *node : -1;
}

SEC("struct_ops/placement_select_cpu")
s32 BPF_PROG(placement_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
    bool idle = 0;
    s32 node = preferred(p), cpu;
    if (node >= 0) {
        cpu = scx_bpf_pick_idle_cpu_node(p->cpus_ptr, node, SCX_PICK_IDLE_IN_NODE);
        if (cpu >= 0) {
            scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, SLICE_NS, 0);
            return cpu;
        }
        return prev_cpu; /* enqueue places it */
    }
    cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &idle);
    if (idle)
        scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, SLICE_NS, 0);
    return cpu;
}

SEC("struct_ops/placement_enqueue")
void BPF_PROG(placement_enqueue, struct task_struct *p, u64 enq_flags)
{
    s32 node = preferred(p), cpu;
    if (node >= 0) {
        cpu = scx_bpf_pick_idle_cpu_node(p->cpus_ptr, node, SCX_PICK_IDLE_IN_NODE);
        if (cpu >= 0) {
            /* into that CPU's own queue: no other CPU takes it first */
            scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL_ON | cpu, SLICE_NS, enq_flags);
            scx_bpf_kick_cpu(cpu, SCX_KICK_IDLE);
            return;
        }
        /* None idle there, but it already runs on its node (its slice ended, ENQ_LAST): it
         * stays on that CPU. Through the shared queue an idle CPU of the other node, kicked
         * below, would take it back across half the time (measured: 52 % remote). */
        cpu = scx_bpf_task_cpu(p);
        if (scx_bpf_cpu_node(cpu) == node) {
            scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL_ON | cpu, SLICE_NS, enq_flags);
            return;
        }
    }
    scx_bpf_dsq_insert(p, SHARED_DSQ, SLICE_NS, enq_flags);
    if (node >= 0) {
        /* without IN_NODE: the node first (none idle), then the others */
        cpu = scx_bpf_pick_idle_cpu_node(p->cpus_ptr, node, 0);
        if (cpu >= 0)
            scx_bpf_kick_cpu(cpu, SCX_KICK_IDLE);
    }
}

SEC("struct_ops/placement_dispatch")
void BPF_PROG(placement_dispatch, s32 cpu, struct task_struct *prev)
{
    scx_bpf_dsq_move_to_local(SHARED_DSQ);
}

SEC("struct_ops.s/placement_init")
s32 BPF_PROG(placement_init)
{
    return scx_bpf_create_dsq(SHARED_DSQ, -1);
}

SEC(".struct_ops.link")
struct sched_ext_ops placement_ops = {
    .select_cpu = (void *)placement_select_cpu,
    .enqueue = (void *)placement_enqueue,
    .dispatch = (void *)placement_dispatch,
    .init = (void *)placement_init,
    /* ENQ_LAST: a CPU's only runnable task whose slice ends comes to enqueue too (by default
     * the kernel keeps running it where it is, and a pod that never sleeps is never moved) */
    .flags = SCX_OPS_SWITCH_PARTIAL | SCX_OPS_ENQ_LAST | SCX_OPS_BUILTIN_IDLE_PER_NODE,
    .timeout_ms = TIMEOUT_MS,
    .name = "kubenpu_placement",
};
