/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Every map call of kubenpu.bpf.c, in both dialects (dialect.h). Included after the maps are
 * declared. BCC's calls are written out because its rewriter skips macro expansions.
 */

#ifndef KUBENPU_MAP_CALLS_H
#define KUBENPU_MAP_CALLS_H

#ifdef KUBENPU_BCC
static __always_inline u32 *minor_vendor(u32 *index) { return minors.lookup(index); }
static __always_inline u32 *other_vendor(u32 *rdev) { return devices.lookup(rdev); }
static __always_inline u32 *ioctl_kind(u32 *index) { return ioctls.lookup(index); }
static __always_inline u32 *gate_value(u32 *zero) { return gate.lookup(zero); }
static __always_inline u64 *lost_slot(u32 *reason) { return lost.lookup(reason); }
static __always_inline void *ring_reserve(u64 size) { return events.ringbuf_reserve(size); }
static __always_inline void ring_submit(void *record) { events.ringbuf_submit(record, 0); }
#ifdef KUBENPU_AGGREGATE
static __always_inline struct count_value *count_of(struct count_key *key) { return counts.lookup(key); }
static __always_inline int count_insert(struct count_key *key, struct count_value *one)
{
    return counts.insert(key, one);
}
#endif

#else /* CO-RE */
static __always_inline u32 *minor_vendor(u32 *index) { return bpf_map_lookup_elem(&minors, index); }
static __always_inline u32 *other_vendor(u32 *rdev) { return bpf_map_lookup_elem(&devices, rdev); }
static __always_inline u32 *ioctl_kind(u32 *index) { return bpf_map_lookup_elem(&ioctls, index); }
static __always_inline u32 *gate_value(u32 *zero) { return bpf_map_lookup_elem(&gate, zero); }
static __always_inline u64 *lost_slot(u32 *reason) { return bpf_map_lookup_elem(&lost, reason); }
static __always_inline void *ring_reserve(u64 size) { return bpf_ringbuf_reserve(&events, size, 0); }
static __always_inline void ring_submit(void *record) { bpf_ringbuf_submit(record, 0); }
#ifdef KUBENPU_AGGREGATE
static __always_inline struct count_value *count_of(struct count_key *key)
{
    return bpf_map_lookup_elem(&counts, key);
}
static __always_inline int count_insert(struct count_key *key, struct count_value *one)
{
    return bpf_map_update_elem(&counts, key, one, BPF_NOEXIST);
}
#endif
#endif

#endif
