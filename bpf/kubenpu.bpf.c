// SPDX-License-Identifier: GPL-2.0
/*
 * KubeNPU kernel side (BCC dialect).
 *
 * fentry on drm_ioctl, the entry point every DRM and accel driver's ioctls pass through.
 * The kernel keeps only calls on known devices whose ioctl nr is in that vendor's table,
 * and sends one small event per kept call to the ring buffer.
 *
 * Python substitutes these before compiling:
 *   KUBENPU_ATTACH  the probe header line (MODULE_KFUNC_PROBE / KFUNC_PROBE / kprobe)
 *   RINGBUF_PAGES   ring buffer size in pages (a power of two)
 * and fills `devices` and `ioctls` before attaching.
 */
#include <linux/fs.h>

#define DRM_IOCTL_TYPE 'd'
#define DRM_COMMAND_BASE 0x40
#define DRM_COMMAND_END 0xA0
#define VENDOR_CORE 0   /* the DRM core table applies to every vendor */

struct ioctl_key {
    u32 vendor;
    u32 nr;
};

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

/* kernel dev_t (MKDEV: major << 20 | minor) -> vendor id */
BPF_HASH(devices, u32, u32, 256);
/* {vendor id, nr} -> kind (1 submit, 2 alloc, 3 wait) */
BPF_HASH(ioctls, struct ioctl_key, u32, 4096);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* events lost because the ring buffer had no room */
BPF_PERCPU_ARRAY(ringbuf_full, u64, 1);

static __always_inline int handle(struct file *filp, unsigned int cmd)
{
    u32 rdev = filp->f_inode->i_rdev;
    u32 *vendor = devices.lookup(&rdev);
    if (!vendor)
        return 0;
    if (((cmd >> 8) & 0xff) != DRM_IOCTL_TYPE)
        return 0;

    struct ioctl_key key = {};
    key.nr = cmd & 0xff;
    key.vendor = (key.nr >= DRM_COMMAND_BASE && key.nr < DRM_COMMAND_END) ? *vendor : VENDOR_CORE;
    u32 *kind = ioctls.lookup(&key);
    if (!kind)
        return 0;

    struct event *e = events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        u32 zero = 0;
        u64 *lost = ringbuf_full.lookup(&zero);
        if (lost)
            (*lost)++;
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->cgroup_id = bpf_get_current_cgroup_id();
    e->tgid = bpf_get_current_pid_tgid() >> 32;
    e->cmd = cmd;
    e->major = rdev >> 20;
    e->minor = rdev & 0xfffff;
    e->kind = *kind;
    e->_pad = 0;
    events.ringbuf_submit(e, 0);
    return 0;
}

KUBENPU_ATTACH
{
    return handle(filp, cmd);
}
