/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel types kubenpu.bpf.c reads, and only the fields it reads (docs/core.md says why this
 * is minimal rather than a full `bpftool btf dump`). preserve_access_index makes every read a
 * CO-RE relocation: libbpf finds each field's offset in the running kernel's BTF at load, so the
 * layout below need not match any kernel. `make vmlinux-check` compares these names against a
 * kernel's BTF.
 */
#ifndef KUBENPU_VMLINUX_H
#define KUBENPU_VMLINUX_H

#include <linux/types.h>
#include <linux/bpf.h> /* uapi: map types, flags and helper ids */

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s64 s64;
typedef u32 dev_t;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct inode {
    unsigned short i_mode; /* guard.bpf.c: only char devices */
    dev_t i_rdev;
};

struct file {
    struct inode *f_inode;
};

struct kernfs_node {
    u64 id;
};

struct cgroup;

struct cgroup_subsys_state {
    struct cgroup *cgroup;
    struct cgroup_subsys_state *parent;
};

struct cgroup_root {
    int hierarchy_id;
};

struct cgroup {
    struct cgroup_subsys_state self;
    struct kernfs_node *kn;
    struct cgroup_root *root;
};

/* The ioctl syscall's registers, read by the exit programs (abi.EXIT_PROGRAMS). */
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
    unsigned long ax; /* the return value, at a kretprobe */
    unsigned long si;
    unsigned long cx;
};
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
    u64 regs[31];
};
#endif

struct task_struct;

#pragma clang attribute pop

#endif
