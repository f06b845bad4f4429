// SPDX-License-Identifier: GPL-2.0
/*
 * KubeNPU GPU jobs (docs/jobs.md): every job of a driver built on the DRM GPU scheduler
 * (amdgpu, xe, panfrost, panthor, v3d, etnaviv, lima, imagination, amdxdna), from the
 * scheduler's tracepoints, aggregated here per {cgroup of the task that queued it, ring}:
 * jobs queued and done, and two histograms in the bucket scheme of the calls' durations
 * (slots.h): the wait from queued to run, and the run from run to done.
 *
 * The tracepoints by kernel (drivers/gpu/drm/scheduler/gpu_scheduler_trace.h); the loader
 * (kubenpu/kernel/jobs.py) loads the set the running kernel has, both with the same arguments:
 *   queued  drm_sched_job        (6.1, 6.12)   drm_sched_job_queue  (6.17 on: 7.3)
 *   run     drm_run_job          (6.1, 6.12)   drm_sched_job_run
 *   done    drm_sched_process_job(6.1, 6.12)   drm_sched_job_done
 * A job is its scheduler fence (struct drm_sched_fence *: job->s_fence at queue and run, the
 * argument itself at done). Queue runs in the submitting task (drm_sched_entity_push_job from
 * its ioctl), so its cgroup is the pod's; run and done run on the scheduler's workqueue and the
 * fence's signalling context, whose task is no one's.
 *
 * A ring's timeout (the scheduler's timeout work, drm_sched_job_timedout, before the driver's
 * timedout_job resets anything) counts one timeout in each key of that ring with jobs in
 * flight then: what a reset's victims are read from, however soon their jobs finish after it
 * (kubenpu/jobs.py pairs them with the reset's uevent).
 *
 * Two flavours of the same bodies (queued, ran, finished, timed_out), which the loader picks by
 * capability (docs/jobs.md):
 *   tp_btf  BTF tracing programs, and fentry on drm_sched_job_timedout: attaching them names
 *           the gpu_sched module's BTF object, which only CAP_SYS_ADMIN may look up;
 *   raw_tp  raw tracepoints, attached by name (module tracepoints included) with CAP_BPF and
 *           CAP_PERFMON, and the timeout seen at workqueue_execute_start of the ring's own
 *           work_tdr (an address test: exact, one hash lookup per work item of the node).
 * Both read the scheduler's fields with bpf_probe_read_kernel at offsets libbpf relocates
 * (CO-RE): against the module's BTF, or against vmlinux's and the module's split BTF read from
 * /sys/kernel/btf (world-readable) and handed to libbpf as one file (kubenpu/kernel/btf.py).
 *
 * Each step also goes to the job_events ring buffer, one record a step (struct job_event), for
 * the blocked-by accounting in user space (kubenpu/sources/contention.py): which pods' jobs ran
 * while a pod's jobs waited. The record's ts_ns is the same clock read as the histograms', so
 * the replayed waits sum to wait_sum_ns exactly. A full ring buffer counts LOST_EVENTS_FULL.
 *
 * Cost: three map operations and one ring-buffer record a job step, none on any syscall path;
 * a walk of job_times a timeout.
 */
#include "dialect.h"
#include <bpf/bpf_core_read.h>
#include "gpu_sched.h"
#include "slots.h"

#define JOBS_IN_FLIGHT 16384
#define JOB_KEYS 4096
#define RINGS 256
#define NAME_LEN 32
#define EVENT_PAGES 1024 /* 4 MiB: 87,381 records, 29,127 jobs between two reads */

struct job {
    u64 queued_ns;
    u64 run_ns;
    u64 cgroup_id;
    u64 ring;
};

struct job_key {
    u64 cgroup_id;
    u64 ring; /* the scheduler's address: rings names it */
};

struct job_times {
    u64 queued;
    u64 done;
    u64 wait_sum_ns;
    u64 run_sum_ns;
    u64 timeouts; /* the ring's timeouts that found jobs of this key in flight */
    u64 wait[DURATION_SLOTS];
    u64 run[DURATION_SLOTS];
};

/* One step of one job (abi.JOB_EVENT). */
struct job_event {
    u32 kind; /* EVENT_QUEUED, EVENT_RUN, EVENT_DONE */
    u32 tgid; /* queued only: the submitting process, a DRM client fdinfo reads */
    u64 ts_ns;
    u64 fence;
    u64 ring;
    u64 cgroup_id; /* queued only: the submitting task's */
    u64 client_id; /* queued only, 6.17 on: the DRM client's drm-client-id; 0 before */
};

_Static_assert(sizeof(struct job_event) == 48, "abi.JOB_EVENT");

#define EVENT_QUEUED 0
#define EVENT_RUN 1
#define EVENT_DONE 2

struct ring {
    char name[NAME_LEN]; /* sched->name: gfx_0.0.0, testdrm-ring */
    char device[NAME_LEN]; /* dev_name(sched->dev): 0000:03:00.0, kubenpu_testdrm */
};

/* Why a job is not in job_times, by index (abi.JOB_LOST_REASONS). */
#define LOST_UNMATCHED 0 /* run or done of a job not seen queued (queued before the attach) */
#define LOST_KEYS_FULL 1 /* job_times had no room for its key */
#define LOST_EVENTS_FULL 2 /* job_events had no room for a step's record */
#define LOST_SLOTS 3

DECLARE_MAP(jobs, BPF_MAP_TYPE_LRU_HASH, u64, struct job, JOBS_IN_FLIGHT);
DECLARE_HASH(job_times, struct job_key, struct job_times, JOB_KEYS);
DECLARE_HASH(rings, u64, struct ring, RINGS);
DECLARE_ARRAY(job_lost, u64, LOST_SLOTS);
DECLARE_RINGBUF(job_events, EVENT_PAGES);
/* The zero value a new key is inserted from (1.7 KB: more than the BPF stack holds). */
DECLARE_ARRAY(job_template, struct job_times, 1);

static __always_inline void lose(u32 why)
{
    u64 *n = bpf_map_lookup_elem(&job_lost, &why);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline void emit(u32 kind, u64 ts_ns, u64 fence, u64 ring, u64 cgroup_id,
                                 u64 client_id)
{
    struct job_event *e = bpf_ringbuf_reserve(&job_events, sizeof(*e), 0);
    if (!e) {
        lose(LOST_EVENTS_FULL);
        return;
    }
    e->kind = kind;
    e->tgid = kind == EVENT_QUEUED ? bpf_get_current_pid_tgid() >> 32 : 0;
    e->ts_ns = ts_ns;
    e->fence = fence;
    e->ring = ring;
    e->cgroup_id = cgroup_id;
    e->client_id = client_id;
    bpf_ringbuf_submit(e, 0);
}

/* The job's DRM client id where the kernel records it (6.17 on), else 0. */
static __always_inline u64 client_of(struct drm_sched_job *sched_job)
{
    struct drm_sched_fence *s_fence = BPF_CORE_READ(sched_job, s_fence);
    if (!s_fence || !bpf_core_field_exists(s_fence->drm_client_id))
        return 0;
    return BPF_CORE_READ(s_fence, drm_client_id);
}

static __always_inline struct job_times *times_of(struct job_key *key)
{
    struct job_times *t = bpf_map_lookup_elem(&job_times, key);
    if (t)
        return t;
    u32 zero = 0;
    struct job_times *empty = bpf_map_lookup_elem(&job_template, &zero);
    if (!empty)
        return 0;
    bpf_map_update_elem(&job_times, key, empty, BPF_NOEXIST);
    return bpf_map_lookup_elem(&job_times, key);
}

static __always_inline void name_ring(struct drm_gpu_scheduler *sched)
{
    u64 ring = (u64)sched;
    if (bpf_map_lookup_elem(&rings, &ring))
        return;
    struct ring r = {};
    bpf_probe_read_kernel_str(r.name, sizeof(r.name), BPF_CORE_READ(sched, name));
    bpf_probe_read_kernel_str(r.device, sizeof(r.device), BPF_CORE_READ(sched, dev, kobj.name));
    bpf_map_update_elem(&rings, &ring, &r, BPF_NOEXIST);
}

/* A global function, verified once on its own: two inlined copies of the bucket math in one
 * program (the wait's and the run's) are past what the verifier explores. */
__noinline u32 job_slot(u64 ns)
{
    return duration_slot(ns);
}

/* tp_btf arguments are trusted pointers the verifier wants null-checked first (raw_tp ones are
 * plain values, read with bpf_probe_read_kernel like every field here). */
static __always_inline int queued(struct drm_sched_job *sched_job)
{
    if (!sched_job)
        return 0;
    u64 fence = (u64)BPF_CORE_READ(sched_job, s_fence);
    struct drm_gpu_scheduler *sched = BPF_CORE_READ(sched_job, sched);
    struct job j = {
        .queued_ns = bpf_ktime_get_ns(),
        .cgroup_id = bpf_get_current_cgroup_id(),
        .ring = (u64)sched,
    };
    name_ring(sched);
    emit(EVENT_QUEUED, j.queued_ns, fence, j.ring, j.cgroup_id, client_of(sched_job));
    struct job_key key = {.cgroup_id = j.cgroup_id, .ring = j.ring};
    struct job_times *t = times_of(&key);
    if (!t) {
        lose(LOST_KEYS_FULL);
        return 0;
    }
    __sync_fetch_and_add(&t->queued, 1);
    bpf_map_update_elem(&jobs, &fence, &j, BPF_ANY);
    return 0;
}

static __always_inline int ran(struct drm_sched_job *sched_job)
{
    if (!sched_job)
        return 0;
    u64 fence = (u64)BPF_CORE_READ(sched_job, s_fence), now = bpf_ktime_get_ns();
    emit(EVENT_RUN, now, fence, (u64)BPF_CORE_READ(sched_job, sched), 0, 0);
    struct job *j = bpf_map_lookup_elem(&jobs, &fence);
    if (j)
        j->run_ns = now;
    else
        lose(LOST_UNMATCHED);
    return 0;
}

static __always_inline int finished(struct drm_sched_fence *s_fence)
{
    if (!s_fence)
        return 0;
    u64 fence = (u64)s_fence, now = bpf_ktime_get_ns();
    emit(EVENT_DONE, now, fence, (u64)BPF_CORE_READ(s_fence, sched), 0, 0);
    struct job *j = bpf_map_lookup_elem(&jobs, &fence);
    if (!j) {
        lose(LOST_UNMATCHED);
        return 0;
    }
    struct job_key key = {.cgroup_id = j->cgroup_id, .ring = j->ring};
    u64 run_ns = j->run_ns, queued_ns = j->queued_ns;
    bpf_map_delete_elem(&jobs, &fence);
    struct job_times *t = bpf_map_lookup_elem(&job_times, &key);
    if (!t)
        return 0; /* its queueing counted the loss */
    if (!run_ns) /* done without a run: a job the scheduler cancelled */
        run_ns = now;
    u64 wait = run_ns - queued_ns, run = now - run_ns;
    u32 ws = job_slot(wait), rs = job_slot(run);
    if (ws < DURATION_SLOTS)
        __sync_fetch_and_add(&t->wait[ws], 1);
    if (rs < DURATION_SLOTS)
        __sync_fetch_and_add(&t->run[rs], 1);
    __sync_fetch_and_add(&t->wait_sum_ns, wait);
    __sync_fetch_and_add(&t->run_sum_ns, run);
    __sync_fetch_and_add(&t->done, 1); /* last: a reader sees done only with its slots */
    return 0;
}

/* Each step's program in both flavours: tp_btf (typed arguments) and raw_tp (the same
 * arguments as u64s, which BPF_PROG casts alike); one body. */
#define JOB_STEP(tracepoint, name, body, args...)                                                  \
    SEC("tp_btf/" tracepoint) int BPF_PROG(name, args) { return body; }                          \
    SEC("raw_tp/" tracepoint) int BPF_PROG(name##_raw, args) { return body; }

JOB_STEP("drm_sched_job", job_queued_6_1, queued(sched_job), struct drm_sched_job *sched_job)
JOB_STEP("drm_run_job", job_run_6_1, ran(sched_job), struct drm_sched_job *sched_job)
JOB_STEP("drm_sched_process_job", job_done_6_1, finished(fence), struct drm_sched_fence *fence)
JOB_STEP("drm_sched_job_queue", job_queued, queued(sched_job), struct drm_sched_job *sched_job)
JOB_STEP("drm_sched_job_run", job_run, ran(sched_job), struct drm_sched_job *sched_job)
JOB_STEP("drm_sched_job_done", job_done, finished(fence), struct drm_sched_fence *fence)

struct bpf_map;

/* One key of job_times at a timeout of `ring`: its jobs in flight then (queued, not done; done
 * is added last, so a racing finish reads as still in flight) get the timeout counted. */
static long in_flight_at_timeout(struct bpf_map *map, struct job_key *key, struct job_times *t,
                                 u64 *ring)
{
    if (key->ring == *ring && t->queued > t->done)
        __sync_fetch_and_add(&t->timeouts, 1);
    return 0;
}

/* The ring whose timeout work `work` is: its work_tdr.work, the first member of its
 * delayed_work (sched_main.c, every kernel here). */
static __always_inline u64 ring_of(struct work_struct *work)
{
    return (u64)work - bpf_core_field_offset(struct drm_gpu_scheduler, work_tdr);
}

static __always_inline int timed_out(u64 ring)
{
    bpf_for_each_map_elem(&job_times, in_flight_at_timeout, &ring, 0);
    return 0;
}

/* tp_btf flavour: the timeout work itself. */
SEC("fentry/drm_sched_job_timedout")
int BPF_PROG(job_timedout, struct work_struct *work)
{
    return timed_out(ring_of(work));
}

/* raw_tp flavour: every work item the node runs, just before its function; the ring's timeout
 * is the one at a known ring's work_tdr (rings holds every ring a job was queued on). */
SEC("raw_tp/workqueue_execute_start")
int BPF_PROG(job_timedout_raw, struct work_struct *work)
{
    u64 ring = ring_of(work);
    if (!bpf_map_lookup_elem(&rings, &ring))
        return 0;
    return timed_out(ring);
}
