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
 * time as a real one's does, and the test still adds idle energy by writing energy_uj. Built in the VM harness against the guest kernel's headers
 * (tests/vm/build.sh); never meant for a real machine.
 */
#include <linux/hwmon.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/version.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_print.h>

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

struct testdrm_arg {
	__u64 unused;
};

#define DRM_IOCTL_TESTDRM_SUBMIT DRM_IOWR(DRM_COMMAND_BASE + 0x00, struct testdrm_arg)
#define DRM_IOCTL_TESTDRM_ALLOC DRM_IOWR(DRM_COMMAND_BASE + 0x01, struct testdrm_arg)

struct testdrm_file {
	atomic64_t submits;
	atomic64_t allocs;
};

struct testdrm_device {
	struct drm_device drm;
};

static struct platform_device *testdrm_pdev;
static struct testdrm_device *testdrm;

static int testdrm_open(struct drm_device *dev, struct drm_file *file)
{
	file->driver_priv = kzalloc(sizeof(struct testdrm_file), GFP_KERNEL);
	return file->driver_priv ? 0 : -ENOMEM;
}

static void testdrm_postclose(struct drm_device *dev, struct drm_file *file)
{
	kfree(file->driver_priv);
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
	hwmon = devm_hwmon_device_register_with_info(&testdrm_pdev->dev, "kubenpu_testdrm", NULL,
						     &testdrm_hwmon_chip, NULL);
	if (IS_ERR(hwmon)) {
		ret = PTR_ERR(hwmon);
		goto out_devres;
	}
	ret = drm_dev_register(&testdrm->drm, 0);
	if (ret)
		goto out_devres;
	return 0;

out_devres:
	devres_release_group(&testdrm_pdev->dev, NULL);
out_unregister:
	platform_device_unregister(testdrm_pdev);
	return ret;
}

static void __exit testdrm_exit(void)
{
	drm_dev_unregister(&testdrm->drm);
	devres_release_group(&testdrm_pdev->dev, NULL);
	platform_device_unregister(testdrm_pdev);
}

module_init(testdrm_init);
module_exit(testdrm_exit);
MODULE_DESCRIPTION("KubeNPU fdinfo test driver (no hardware)");
MODULE_LICENSE("GPL");
