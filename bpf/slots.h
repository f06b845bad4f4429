/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The duration histograms' bucket scheme, one for every histogram the kernel side keeps (the
 * calls' durations in kubenpu.bpf.c, the GPU jobs' queue and run times in jobs.bpf.c):
 * kubenpu/kernel/abi.py mirrors it, and tests/test_abi.py checks the two against each other.
 * An OpenTelemetry exponential histogram at scale 2 in seconds, indexes FIRST_INDEX on; slot 0
 * is under the first bucket, slot BUCKETS + 1 over the last.
 */
#ifndef KUBENPU_SLOTS_H
#define KUBENPU_SLOTS_H

#define BUCKETS 104
#define DURATION_SLOTS (BUCKETS + 2)
#define FIRST_INDEX (-80)
#define OVER_NS 64000000000ULL
#define NS_TO_UNITS 72057594ULL

/* The highest set bit of v (v > 0), without a loop. */
static __always_inline u32 msb64(u64 v)
{
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) r += 1;
    return r;
}

/* The slot of a duration: ns to units of 2^-40 s, the power of two, and which quarter of it
 * (thresholds 2^(q/4) * 2^63). An exact power of two ends the bucket under it, hence units - 1. */
static __always_inline u32 duration_slot(u64 ns)
{
    if (ns > OVER_NS)
        return BUCKETS + 1;
    u64 units = (ns * NS_TO_UNITS) >> 16;
    if (units <= (1ULL << 20))
        return 0;
    u64 below = units - 1;
    u32 power = msb64(below);
    u64 top = below << (63 - power);
    int index = 4 * ((int)power - 40) + (top > 0x9837F0518DB8A800ULL) +
                (top > 0xB504F333F9DE6800ULL) + (top > 0xD744FCCAD69D6800ULL);
    int slot = 1 + index - FIRST_INDEX;
    return slot > BUCKETS + 1 ? BUCKETS + 1 : (u32)slot;
}

#endif
