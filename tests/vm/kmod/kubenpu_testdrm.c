// SPDX-License-Identifier: GPL-2.0
/*
 * kubenpu_testdrm: a DRM driver with no hardware, for the VM tests of KubeNPU's fdinfo reader
 * (docs/fdinfo.md). It registers one device (a card and a render node) whose clients print
 * drm-usage-stats (the kernel's Documentation/gpu/drm-usage-stats.rst) that follow their own
 * ioctls, so a test knows every value a client must show:
 *
 *   SUBMIT (DRM_IOWR(0x40, 8)): engine "render" +1,000,000 ns, engine "copy" +250,000 ns,
 *                               engine "compute" +3,000 cycles of +10,000 total cycles
 *   ALLOC  (DRM_IOWR(0x41, 8)): region "system" +64 KiB total, +48 KiB resident, +16 KiB shared,
 *                               +8 KiB active, +4 KiB purgeable; region "vram" +1 MiB in the
 *                               deprecated drm-memory-vram (resident)
 *
 * Constants (engine-capacity-render 2, maxfreq-compute 1000 MHz) are printed too. Argument
 * structs are ignored.
 *
 * A hwmon device (issue 22; Documentation/hwmon/sysfs-interface.rst) hangs off the platform
 * device, so it is /sys/class/drm/cardN/device/hwmon/hwmonM like a PCI GPU's: power1_input and
 * power1_cap (µW), energy1_input (µJ), temp1_input (m°C), in0_input (mV). The test sets them through the module's
 * parameters (/sys/module/kubenpu_testdrm/parameters/): energy1_input is energy_uj plus
 * ENERGY_UJ_PER_SUBMIT for every SUBMIT since load, so the device's energy follows its busy
 * time as a real one's does, and the test still adds idle energy by writing energy_uj.
 *
 * A ring on the real DRM GPU scheduler (drivers/gpu/drm/scheduler), one job on the "hardware"
 * at a time (credit_limit 1), takes jobs of a duration each ioctl names (its argument is ignored,
 * so any caller of DRM_IOWR(nr, 8) can submit): JOB_50MS (0x42) and JOB_10MS (0x43), the job's
 * fence signalled by a timer when it is over, and JOB_0 (0x45), whose fence is signalled as the
 * job starts, with no timer (the scheduler's own cost per job: the benchmark's jobs/s, which a
 * timer interrupt's latency under emulation would swamp); JOB_HANG (0x44) never signals, so the scheduler's
 * timeout (JOB_TIMEOUT_MS) fires and the driver resets the ring, failing the job with -ETIME, and
 * sends the wedged uevent WEDGED=none naming the job's submitter as the guilty task, as amdgpu
 * names the owner of the hung job. Writing 1 to `ring_paused` holds the job on the "hardware"
 * (its timer not started) until 0 is written, so a test can queue jobs of several callers
 * behind it in a known order. A caller keeps its fd open until its jobs are done: closing it
 * kills the jobs still queued (drm_sched_entity_destroy). The scheduler's tracepoints see
 * these jobs as a real driver's.
 *
 * Each job's own times (ktime_get_ns, the clock of bpf_ktime_get_ns) are kept, the first
 * MAX_STAMPS jobs since load, two reads a step with the scheduler's tracepoint between them:
 * queued (just before and just after the push that fires the queue tracepoint), run
 * (prepare_job, as the scheduler's run work takes the job, and run_job's start, around the run
 * tracepoint) and done (the hardware fence's signal, and a callback on the scheduler's finished
 * fence, signalled right after the done tracepoint: when the scheduler took the job off the
 * ring, which under load can be well after the hardware fence signalled, if the scheduler's
 * work had not yet added its callback to it), with the submitter's tgid. The debugfs file
 * testdrm-jobs prints one line per job, "tgid queued queued' run run' done done'" (0: not
 * yet): the reference the VM test computes bounds on each pod's wait behind the others from,
 * independently of the scheduler's tracepoints. Two reads, not one: under TCG the guest can
 * freeze for tens of milliseconds between any two clock reads (tests/test_node_vm.py).
 *
 * Writing a recovery method ("rebind", "none") to the `wedge` parameter sends the DRM wedged
 * uevent a driver sends after a hang, with the writer as the guilty task: through
 * drm_dev_wedged_event() where the kernel has it with task info (6.17), else the same uevent
 * by hand (its format: drivers/gpu/drm/drm_drv.c). Built in the VM harness against the guest
 * kernel's headers (tests/vm/build.sh); never meant for a real machine.
 */
#include <linux/debugfs.h>
#include <linux/hwmon.h>
#include <linux/seq_file.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/version.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_print.h>
#include <drm/gpu_scheduler.h>
#include <linux/dma-fence.h>
#include <linux/hrtimer.h>

#define RENDER_NS_PER_SUBMIT 1000000ULL
#define COPY_NS_PER_SUBMIT 250000ULL
#define CYCLES_PER_SUBMIT 3000ULL
#define TOTAL_CYCLES_PER_SUBMIT 10000ULL
#define KIB_PER_ALLOC 64ULL
#define VRAM_MIB_PER_ALLOC 1ULL
#define ENERGY_UJ_PER_SUBMIT 2000000LL /* 2 J */

static long energy_uj;
module_param(energy_uj, long, 0644);
MODULE_PARM_DESC(energy_uj, "energy1_input's base in µJ (SUBMITs add to it)");
static long power_uw = 25000000;
module_param(power_uw, long, 0644);
MODULE_PARM_DESC(power_uw, "power1_input in µW");
static long power_cap_uw = 150000000;
module_param(power_cap_uw, long, 0644);
MODULE_PARM_DESC(power_cap_uw, "power1_cap in µW");
static long temp_mc = 45000;
module_param(temp_mc, long, 0644);
MODULE_PARM_DESC(temp_mc, "temp1_input in m°C");

static long in_mv = 850;
module_param(in_mv, long, 0644);
MODULE_PARM_DESC(in_mv, "in0_input in mV");

static atomic64_t submit_energy_uj = ATOMIC64_INIT(0);

#define MAX_STAMPS 1024
/* Each step's tracepoint lies between the two reads: [0] before it, [1] after it. */
struct testdrm_stamp {
	pid_t tgid;
	u64 queued[2], run[2], done[2];
};
static struct testdrm_stamp stamps[MAX_STAMPS];
static atomic_t stamped = ATOMIC_INIT(0);
static struct dentry *stamps_file;

static int testdrm_stamps_show(struct seq_file *m, void *unused)
{
	int i, n = min(atomic_read(&stamped), MAX_STAMPS);

	for (i = 0; i < n; i++)
		seq_printf(m, "%d %llu %llu %llu %llu %llu %llu\n", stamps[i].tgid,
			   READ_ONCE(stamps[i].queued[0]), READ_ONCE(stamps[i].queued[1]),
			   READ_ONCE(stamps[i].run[0]), READ_ONCE(stamps[i].run[1]),
			   READ_ONCE(stamps[i].done[0]), READ_ONCE(stamps[i].done[1]));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(testdrm_stamps);

static void testdrm_stamp(int stamp, u64 *field)
{
	if (stamp >= 0 && stamp < MAX_STAMPS)
		WRITE_ONCE(*field, ktime_get_ns());
}

static struct testdrm_device *testdrm;

/* The job on the "hardware" while the ring is paused: its timer starts when it is resumed. */
static DEFINE_SPINLOCK(pause_lock);
static bool ring_paused;
static struct testdrm_job *held_job;
static void testdrm_start_timer(struct testdrm_job *job);
static int testdrm_pause(const char *val, const struct kernel_param *kp)
{
	struct testdrm_job *resume = NULL;
	bool paused;
	int ret = kstrtobool(val, &paused);

	if (ret)
		return ret;
	spin_lock(&pause_lock);
	ring_paused = paused;
	if (!paused) {
		resume = held_job;
		held_job = NULL;
	}
	spin_unlock(&pause_lock);
	if (resume)
		testdrm_start_timer(resume);
	return 0;
}
static const struct kernel_param_ops testdrm_pause_ops = { .set = testdrm_pause,
							   .get = param_get_bool };
module_param_cb(ring_paused, &testdrm_pause_ops, &ring_paused, 0644);
MODULE_PARM_DESC(ring_paused, "1: the running job waits until 0 is written");

static int testdrm_wedge(const char *val, const struct kernel_param *kp);
static const struct kernel_param_ops testdrm_wedge_ops = { .set = testdrm_wedge };
module_param_cb(wedge, &testdrm_wedge_ops, NULL, 0200);
MODULE_PARM_DESC(wedge, "write rebind or none: send the DRM wedged uevent with that method");

struct testdrm_arg {
	__u64 unused;
};

#define DRM_IOCTL_TESTDRM_SUBMIT DRM_IOWR(DRM_COMMAND_BASE + 0x00, struct testdrm_arg)
#define DRM_IOCTL_TESTDRM_ALLOC DRM_IOWR(DRM_COMMAND_BASE + 0x01, struct testdrm_arg)

#define JOB_HANGS 0xffffffffU
#define JOB_TIMEOUT_MS 10000 /* longer than a test holds a paused ring */
#define DRM_IOCTL_TESTDRM_JOB_50MS DRM_IOWR(DRM_COMMAND_BASE + 0x02, struct testdrm_arg)
#define DRM_IOCTL_TESTDRM_JOB_10MS DRM_IOWR(DRM_COMMAND_BASE + 0x03, struct testdrm_arg)
#define DRM_IOCTL_TESTDRM_JOB_HANG DRM_IOWR(DRM_COMMAND_BASE + 0x04, struct testdrm_arg)
#define DRM_IOCTL_TESTDRM_JOB_0 DRM_IOWR(DRM_COMMAND_BASE + 0x05, struct testdrm_arg)

struct testdrm_file {
	atomic64_t submits;
	atomic64_t allocs;
	struct drm_sched_entity entity;
};

struct testdrm_device {
	struct drm_device drm;
	struct drm_gpu_scheduler ring;
	u64 fence_context;
	atomic64_t fence_seqno;
	spinlock_t fence_lock;
};

/* The "hardware" fence of one job: signalled by its timer, or failed by a reset. */
struct testdrm_hw {
	struct dma_fence base;
	struct hrtimer timer;
	int stamp; /* its job's index in stamps */
};

struct testdrm_job {
	struct drm_sched_job base;
	u32 duration_us;
	struct testdrm_hw *hw;
	pid_t pid; /* the submitter: the guilty task if the job hangs */
	int stamp; /* its index in stamps */
	struct dma_fence_cb finished; /* on base.s_fence->finished: the done stamp */
	char comm[TASK_COMM_LEN];
};

static struct platform_device *testdrm_pdev;

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
static int testdrm_wedged_event(bool recovered, pid_t guilty, const char *comm)
{
	struct drm_wedge_task_info info = { .pid = guilty };

	strscpy(info.comm, comm, sizeof(info.comm));
	return drm_dev_wedged_event(&testdrm->drm, recovered ? DRM_WEDGE_RECOVERY_NONE :
				    DRM_WEDGE_RECOVERY_REBIND, &info);
}
#else
static int testdrm_wedged_event(bool recovered, pid_t guilty, const char *comm)
{
	char event[32], pid[32], task[8 + TASK_COMM_LEN];
	char *envp[] = { event, pid, task, NULL };

	snprintf(event, sizeof(event), "WEDGED=%s", recovered ? "none" : "rebind");
	snprintf(pid, sizeof(pid), "PID=%d", guilty);
	snprintf(task, sizeof(task), "TASK=%s", comm);
	return kobject_uevent_env(&testdrm->drm.primary->kdev->kobj, KOBJ_CHANGE, envp);
}
#endif

static int testdrm_wedge(const char *val, const struct kernel_param *kp)
{
	if (!testdrm)
		return -ENODEV;
	if (sysfs_streq(val, "rebind") || sysfs_streq(val, "none"))
		return testdrm_wedged_event(sysfs_streq(val, "none"), task_pid_nr(current),
					    current->comm);
	return -EINVAL;
}


static const char *testdrm_fence_driver(struct dma_fence *fence)
{
	return "kubenpu_testdrm";
}

static const char *testdrm_fence_timeline(struct dma_fence *fence)
{
	return "ring";
}

static const struct dma_fence_ops testdrm_fence_ops = {
	.get_driver_name = testdrm_fence_driver,
	.get_timeline_name = testdrm_fence_timeline,
};

/* The hardware fence signalled: the scheduler's done tracepoint comes after (its callback on
 * this fence, or its run work's finding it signalled). */
static void testdrm_signal(struct testdrm_hw *hw)
{
	testdrm_stamp(hw->stamp, &stamps[hw->stamp % MAX_STAMPS].done[0]);
	dma_fence_signal(&hw->base);
}

static enum hrtimer_restart testdrm_job_over(struct hrtimer *timer)
{
	struct testdrm_hw *hw = container_of(timer, struct testdrm_hw, timer);

	testdrm_signal(hw);
	dma_fence_put(&hw->base); /* the timer's reference */
	return HRTIMER_NORESTART;
}

static void testdrm_start_timer(struct testdrm_job *job)
{
	struct testdrm_hw *hw = job->hw;

	if (job->duration_us == JOB_HANGS)
		return;
	if (!job->duration_us) { /* JOB_0: done at once; the scheduler sees it signalled */
		testdrm_signal(hw);
		return;
	}
	dma_fence_get(&hw->base);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 15, 0)
	hrtimer_setup(&hw->timer, testdrm_job_over, CLOCK_MONOTONIC, HRTIMER_MODE_REL);
#else
	hrtimer_init(&hw->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL);
	hw->timer.function = testdrm_job_over;
#endif
	hrtimer_start(&hw->timer, ns_to_ktime((u64)job->duration_us * NSEC_PER_USEC),
		      HRTIMER_MODE_REL);
}

static struct dma_fence *testdrm_run_job(struct drm_sched_job *sched_job)
{
	struct testdrm_job *job = container_of(sched_job, struct testdrm_job, base);
	struct testdrm_hw *hw = kzalloc(sizeof(*hw), GFP_KERNEL);
	bool hold;

	testdrm_stamp(job->stamp, &stamps[job->stamp % MAX_STAMPS].run[1]);
	if (!hw)
		return ERR_PTR(-ENOMEM);
	hw->stamp = job->stamp;
	dma_fence_init(&hw->base, &testdrm_fence_ops, &testdrm->fence_lock, testdrm->fence_context,
		       atomic64_inc_return(&testdrm->fence_seqno));
	job->hw = hw;
	dma_fence_get(&hw->base); /* the job's, put in free_job; init's is the scheduler's */
	spin_lock(&pause_lock);
	hold = ring_paused && !held_job;
	if (hold)
		held_job = job;
	spin_unlock(&pause_lock);
	if (!hold)
		testdrm_start_timer(job);
	return &hw->base;
}

/* The hung job: stop the ring, "reset the hardware" (fail the job's fence), restart, and say so. */
static enum drm_gpu_sched_stat testdrm_timedout_job(struct drm_sched_job *sched_job)
{
	struct testdrm_job *job = container_of(sched_job, struct testdrm_job, base);

	drm_sched_stop(&testdrm->ring, sched_job);
	if (job->hw && !dma_fence_is_signaled(&job->hw->base)) {
		dma_fence_set_error(&job->hw->base, -ETIME);
		testdrm_signal(job->hw);
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
	drm_sched_start(&testdrm->ring, 0);
	testdrm_wedged_event(true, job->pid, job->comm);
	return DRM_GPU_SCHED_STAT_RESET;
#else
	drm_sched_start(&testdrm->ring);
	testdrm_wedged_event(true, job->pid, job->comm);
	return DRM_GPU_SCHED_STAT_NOMINAL;
#endif
}

static void testdrm_free_job(struct drm_sched_job *sched_job)
{
	struct testdrm_job *job = container_of(sched_job, struct testdrm_job, base);

	drm_sched_job_cleanup(sched_job);
	if (job->hw)
		dma_fence_put(&job->hw->base);
	kfree(job);
}

/* Called as the scheduler's run work takes the job, before its run tracepoint: the run's [0]. */
static struct dma_fence *testdrm_prepare_job(struct drm_sched_job *sched_job,
					     struct drm_sched_entity *entity)
{
	struct testdrm_job *job = container_of(sched_job, struct testdrm_job, base);

	testdrm_stamp(job->stamp, &stamps[job->stamp % MAX_STAMPS].run[0]);
	return NULL;
}

static const struct drm_sched_backend_ops testdrm_sched_ops = {
	.prepare_job = testdrm_prepare_job,
	.run_job = testdrm_run_job,
	.timedout_job = testdrm_timedout_job,
	.free_job = testdrm_free_job,
};

static void testdrm_finished(struct dma_fence *fence, struct dma_fence_cb *cb)
{
	struct testdrm_job *job = container_of(cb, struct testdrm_job, finished);

	testdrm_stamp(job->stamp, &stamps[job->stamp % MAX_STAMPS].done[1]);
}

static int testdrm_job(struct drm_file *file, u32 duration_us)
{
	struct testdrm_file *f = file->driver_priv;
	struct testdrm_job *job = kzalloc(sizeof(*job), GFP_KERNEL);
	int ret, stamp;

	if (!job)
		return -ENOMEM;
	job->duration_us = duration_us;
	job->pid = task_pid_nr(current);
	get_task_comm(job->comm, current);
	ret = drm_sched_job_init(&job->base, &f->entity, 1, f, file->client_id);
	if (ret) {
		kfree(job);
		return ret;
	}
	drm_sched_job_arm(&job->base);
	job->stamp = atomic_inc_return(&stamped) - 1;
	if (job->stamp < MAX_STAMPS)
		stamps[job->stamp].tgid = task_tgid_nr(current);
	/* the job is freed (free_job) only after its finished fence's callbacks ran */
	dma_fence_add_callback(&job->base.s_fence->finished, &job->finished, testdrm_finished);
	stamp = job->stamp; /* the job may be run, done and freed before the push returns */
	testdrm_stamp(stamp, &stamps[stamp % MAX_STAMPS].queued[0]);
	drm_sched_entity_push_job(&job->base);
	testdrm_stamp(stamp, &stamps[stamp % MAX_STAMPS].queued[1]);
	return 0;
}

static int testdrm_job_50ms(struct drm_device *dev, void *data, struct drm_file *file)
{
	return testdrm_job(file, 50000);
}

static int testdrm_job_10ms(struct drm_device *dev, void *data, struct drm_file *file)
{
	return testdrm_job(file, 10000);
}

static int testdrm_job_0(struct drm_device *dev, void *data, struct drm_file *file)
{
	return testdrm_job(file, 0);
}

static int testdrm_job_hang(struct drm_device *dev, void *data, struct drm_file *file)
{
	return testdrm_job(file, JOB_HANGS);
}

static int testdrm_open(struct drm_device *dev, struct drm_file *file)
{
	struct drm_gpu_scheduler *ring = &testdrm->ring;
	struct testdrm_file *f = kzalloc(sizeof(*f), GFP_KERNEL);
	int ret;

	if (!f)
		return -ENOMEM;
	ret = drm_sched_entity_init(&f->entity, DRM_SCHED_PRIORITY_NORMAL, &ring, 1, NULL);
	if (ret) {
		kfree(f);
		return ret;
	}
	file->driver_priv = f;
	return 0;
}

static void testdrm_postclose(struct drm_device *dev, struct drm_file *file)
{
	struct testdrm_file *f = file->driver_priv;

	drm_sched_entity_destroy(&f->entity);
	kfree(f);
}

static int testdrm_submit(struct drm_device *dev, void *data, struct drm_file *file)
{
	atomic64_inc(&((struct testdrm_file *)file->driver_priv)->submits);
	atomic64_add(ENERGY_UJ_PER_SUBMIT, &submit_energy_uj);
	return 0;
}

static int testdrm_alloc(struct drm_device *dev, void *data, struct drm_file *file)
{
	atomic64_inc(&((struct testdrm_file *)file->driver_priv)->allocs);
	return 0;
}

static void testdrm_show_fdinfo(struct drm_printer *p, struct drm_file *file)
{
	struct testdrm_file *f = file->driver_priv;
	u64 submits = atomic64_read(&f->submits);
	u64 kib = atomic64_read(&f->allocs) * KIB_PER_ALLOC;

	drm_printf(p, "drm-engine-render:\t%llu ns\n", submits * RENDER_NS_PER_SUBMIT);
	drm_printf(p, "drm-engine-capacity-render:\t2\n");
	drm_printf(p, "drm-engine-copy:\t%llu ns\n", submits * COPY_NS_PER_SUBMIT);
	drm_printf(p, "drm-cycles-compute:\t%llu\n", submits * CYCLES_PER_SUBMIT);
	drm_printf(p, "drm-total-cycles-compute:\t%llu\n", submits * TOTAL_CYCLES_PER_SUBMIT);
	drm_printf(p, "drm-maxfreq-compute:\t1000 MHz\n");
	drm_printf(p, "drm-total-system:\t%llu KiB\n", kib);
	drm_printf(p, "drm-resident-system:\t%llu KiB\n", kib / 4 * 3);
	drm_printf(p, "drm-shared-system:\t%llu KiB\n", kib / 4);
	drm_printf(p, "drm-active-system:\t%llu KiB\n", kib / 8);
	drm_printf(p, "drm-purgeable-system:\t%llu KiB\n", kib / 16);
	drm_printf(p, "drm-memory-vram:\t%llu MiB\n", atomic64_read(&f->allocs) * VRAM_MIB_PER_ALLOC);
}

static const struct drm_ioctl_desc testdrm_ioctls[] = {
	DRM_IOCTL_DEF_DRV(TESTDRM_SUBMIT, testdrm_submit, DRM_RENDER_ALLOW),
	DRM_IOCTL_DEF_DRV(TESTDRM_ALLOC, testdrm_alloc, DRM_RENDER_ALLOW),
	DRM_IOCTL_DEF_DRV(TESTDRM_JOB_50MS, testdrm_job_50ms, DRM_RENDER_ALLOW),
	DRM_IOCTL_DEF_DRV(TESTDRM_JOB_10MS, testdrm_job_10ms, DRM_RENDER_ALLOW),
	DRM_IOCTL_DEF_DRV(TESTDRM_JOB_HANG, testdrm_job_hang, DRM_RENDER_ALLOW),
	DRM_IOCTL_DEF_DRV(TESTDRM_JOB_0, testdrm_job_0, DRM_RENDER_ALLOW),
};

static const struct file_operations testdrm_fops = {
	.owner = THIS_MODULE,
	.open = drm_open,
	.release = drm_release,
	.unlocked_ioctl = drm_ioctl,
	.compat_ioctl = drm_compat_ioctl,
	.poll = drm_poll,
	.read = drm_read,
	.show_fdinfo = drm_show_fdinfo,
#ifdef FOP_UNSIGNED_OFFSET
	/* From 6.12 drm_open refuses (-EINVAL, with a warning) a DRM file without it. */
	.fop_flags = FOP_UNSIGNED_OFFSET,
#endif
};

static const struct drm_driver testdrm_driver = {
	.driver_features = DRIVER_RENDER,
	.open = testdrm_open,
	.postclose = testdrm_postclose,
	.show_fdinfo = testdrm_show_fdinfo,
	.ioctls = testdrm_ioctls,
	.num_ioctls = ARRAY_SIZE(testdrm_ioctls),
	.fops = &testdrm_fops,
	.name = "kubenpu_testdrm",
	.desc = "KubeNPU fdinfo test driver",
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 14, 0)
	.date = "20261201",
#endif
	.major = 1,
	.minor = 0,
};

static umode_t testdrm_hwmon_visible(const void *data, enum hwmon_sensor_types type, u32 attr,
				     int channel)
{
	return 0444;
}

static int testdrm_hwmon_read(struct device *dev, enum hwmon_sensor_types type, u32 attr,
			      int channel, long *val)
{
	switch (type) {
	case hwmon_power:
		*val = attr == hwmon_power_cap ? READ_ONCE(power_cap_uw) : READ_ONCE(power_uw);
		return 0;
	case hwmon_energy:
		*val = READ_ONCE(energy_uj) + atomic64_read(&submit_energy_uj);
		return 0;
	case hwmon_temp:
		*val = READ_ONCE(temp_mc);
		return 0;
	case hwmon_in:
		*val = READ_ONCE(in_mv);
		return 0;
	default:
		return -EOPNOTSUPP;
	}
}

static const struct hwmon_ops testdrm_hwmon_ops = {
	.is_visible = testdrm_hwmon_visible,
	.read = testdrm_hwmon_read,
};

/* No `* const`: 6.1's hwmon_chip_info.info is `const struct hwmon_channel_info **`. */
static const struct hwmon_channel_info *testdrm_hwmon_info[] = {
	HWMON_CHANNEL_INFO(power, HWMON_P_INPUT | HWMON_P_CAP),
	HWMON_CHANNEL_INFO(energy, HWMON_E_INPUT),
	HWMON_CHANNEL_INFO(temp, HWMON_T_INPUT),
	HWMON_CHANNEL_INFO(in, HWMON_I_INPUT),
	NULL
};

static const struct hwmon_chip_info testdrm_hwmon_chip = {
	.ops = &testdrm_hwmon_ops,
	.info = testdrm_hwmon_info,
};

/* As vgem does it (before the faux bus): a bare platform device holding a devres group. */
static int __init testdrm_init(void)
{
	struct device *hwmon;
	int ret;

	testdrm_pdev = platform_device_register_simple("kubenpu_testdrm", -1, NULL, 0);
	if (IS_ERR(testdrm_pdev))
		return PTR_ERR(testdrm_pdev);
	if (!devres_open_group(&testdrm_pdev->dev, NULL, GFP_KERNEL)) {
		ret = -ENOMEM;
		goto out_unregister;
	}
	testdrm = devm_drm_dev_alloc(&testdrm_pdev->dev, &testdrm_driver, struct testdrm_device,
				     drm);
	if (IS_ERR(testdrm)) {
		ret = PTR_ERR(testdrm);
		goto out_devres;
	}
	spin_lock_init(&testdrm->fence_lock);
	testdrm->fence_context = dma_fence_context_alloc(1);
	ret = drm_sched_init(&testdrm->ring, &(struct drm_sched_init_args){
		.ops = &testdrm_sched_ops,
		.num_rqs = DRM_SCHED_PRIORITY_COUNT,
		.credit_limit = 1,
		.timeout = msecs_to_jiffies(JOB_TIMEOUT_MS),
		.name = "testdrm-ring",
		.dev = &testdrm_pdev->dev,
	});
	if (ret)
		goto out_devres;
	hwmon = devm_hwmon_device_register_with_info(&testdrm_pdev->dev, "kubenpu_testdrm", NULL,
						     &testdrm_hwmon_chip, NULL);
	if (IS_ERR(hwmon)) {
		ret = PTR_ERR(hwmon);
		goto out_sched;
	}
	ret = drm_dev_register(&testdrm->drm, 0);
	if (ret)
		goto out_sched;
	stamps_file = debugfs_create_file("testdrm-jobs", 0444, NULL, NULL,
					  &testdrm_stamps_fops);
	return 0;

out_sched:
	drm_sched_fini(&testdrm->ring);
out_devres:
	devres_release_group(&testdrm_pdev->dev, NULL);
out_unregister:
	platform_device_unregister(testdrm_pdev);
	return ret;
}

static void __exit testdrm_exit(void)
{
	debugfs_remove(stamps_file);
	drm_dev_unregister(&testdrm->drm);
	drm_sched_fini(&testdrm->ring);
	devres_release_group(&testdrm_pdev->dev, NULL);
	platform_device_unregister(testdrm_pdev);
}

module_init(testdrm_init);
module_exit(testdrm_exit);
MODULE_DESCRIPTION("KubeNPU fdinfo test driver (no hardware)");
MODULE_LICENSE("GPL");
