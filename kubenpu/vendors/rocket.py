"""Rockchip NPU, rocket (include/uapi/drm/rocket_accel.h). An accel driver.

The accel device's parent is a driverless "rknn" facade platform device; the NPU cores are bound
to the "rocket" platform driver.
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="rocket",
    drivers=("rocket",),
    header="drm/rocket_accel.h",
    ioctls=(
        Ioctl(0x40, Kind.ALLOC, "DRM_IOCTL_ROCKET_CREATE_BO"),
        Ioctl(0x41, Kind.SUBMIT, "DRM_IOCTL_ROCKET_SUBMIT"),
        # CPU-prep style: blocks until the NPU is done with the buffer.
        Ioctl(0x42, Kind.WAIT, "DRM_IOCTL_ROCKET_PREP_BO"),
    ),
)
