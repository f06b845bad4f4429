/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The DRM GPU scheduler's types that jobs.bpf.c reads, and only the fields it reads
 * (include/drm/gpu_scheduler.h). They live in the gpu_sched module's BTF, not vmlinux's: libbpf
 * relocates each read against the module's BTF at load, as vmlinux.h's against the kernel's.
 */
#ifndef KUBENPU_GPU_SCHED_H
#define KUBENPU_GPU_SCHED_H

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct kobject {
    const char *name;
};

struct device {
    struct kobject kobj;
};

/* Only its place in drm_gpu_scheduler is read (its first member is the work_struct). */
struct delayed_work {
    long work;
};

struct drm_gpu_scheduler {
    const char *name;
    struct device *dev;
    struct delayed_work work_tdr;
};

struct work_struct;

/* 6.17 on: the DRM client (fdinfo's drm-client-id) that queued the job; read only where the
 * kernel's BTF has it (bpf_core_field_exists). */
struct drm_sched_fence {
    struct drm_gpu_scheduler *sched;
    u64 drm_client_id;
};

struct drm_sched_job {
    struct drm_gpu_scheduler *sched;
    struct drm_sched_fence *s_fence;
};

struct drm_sched_entity;

#pragma clang attribute pop

#endif
