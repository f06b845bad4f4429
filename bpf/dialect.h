/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The two ways kubenpu.bpf.c is built, so that there is one source of the kernel logic:
 * - CO-RE (the default): `clang -target bpf -g` ahead of time against the minimal vmlinux.h; libbpf
 *   relocates every field read at load time, so the node needs neither headers nor LLVM;
 * - BCC (-DKUBENPU_BCC, the fallback): compiled on the node against its kernel headers.
 * Only map declarations, program headers and map calls differ. Map calls are in map_calls.h, as
 * small inline functions: BCC rewrites `map.lookup(...)` only where it is written out, not in a
 * macro's expansion.
 */
#ifndef KUBENPU_DIALECT_H
#define KUBENPU_DIALECT_H

#ifdef KUBENPU_BCC
#include <linux/fs.h>
#include <linux/cgroup-defs.h>
#include <linux/kernfs.h>

/* A BTF tracing program (BCC's BPF_PROG declares the int itself). */
#define TRACING_PROG(section, name, args...) BPF_PROG(name, args)
#define DECLARE_HASH(name, k, v, n) BPF_HASH(name, k, v, n)
#define DECLARE_PERCPU_HASH(name, k, v, n) BPF_PERCPU_HASH(name, k, v, n)
#define DECLARE_ARRAY(name, v, n) BPF_ARRAY(name, v, n)
#define DECLARE_PERCPU_ARRAY(name, v, n) BPF_PERCPU_ARRAY(name, v, n)
#define DECLARE_RINGBUF(name, pages) BPF_RINGBUF_OUTPUT(name, pages)

#else /* CO-RE */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define TRACING_PROG(section, name, args...) SEC(section) int BPF_PROG(name, args)
#define DECLARE_MAP(name, map_type, k, v, n)                                                       \
    struct {                                                                                   \
        __uint(type, map_type);                                                                \
        __type(key, k);                                                                        \
        __type(value, v);                                                                      \
        __uint(max_entries, n);                                                                \
    } name SEC(".maps")
#define DECLARE_HASH(name, k, v, n) DECLARE_MAP(name, BPF_MAP_TYPE_HASH, k, v, n)
#define DECLARE_PERCPU_HASH(name, k, v, n) DECLARE_MAP(name, BPF_MAP_TYPE_PERCPU_HASH, k, v, n)
#define DECLARE_ARRAY(name, v, n) DECLARE_MAP(name, BPF_MAP_TYPE_ARRAY, u32, v, n)
#define DECLARE_PERCPU_ARRAY(name, v, n) DECLARE_MAP(name, BPF_MAP_TYPE_PERCPU_ARRAY, u32, v, n)
/* The loader sizes the ring buffer and counts map (bpf_map__set_max_entries) before loading. */
#define DECLARE_RINGBUF(name, pages)                                                               \
    struct {                                                                                   \
        __uint(type, BPF_MAP_TYPE_RINGBUF);                                                    \
        __uint(max_entries, (pages) * 4096);                                                   \
    } name SEC(".maps")

char LICENSE[] SEC("license") = "GPL";
#endif

/* Sizes the loader may change: BCC passes them as -D, CO-RE resizes the maps before load. */
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256
#endif
#ifndef COUNTS_ENTRIES
#define COUNTS_ENTRIES 16384
#endif
#ifndef DURATIONS_ENTRIES
#define DURATIONS_ENTRIES 4096
#endif

#endif
