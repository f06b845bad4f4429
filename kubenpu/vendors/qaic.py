"""Qualcomm Cloud AI 100, qaic (include/uapi/drm/qaic_accel.h). An accel driver."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="qaic",
    drivers=("qaic",),
    header="drm/qaic_accel.h",
    ioctls=(
        Ioctl(0x41, Kind.ALLOC, "DRM_IOCTL_QAIC_CREATE_BO"),
        Ioctl(0x44, Kind.SUBMIT, "DRM_IOCTL_QAIC_EXECUTE_BO"),
        Ioctl(0x45, Kind.SUBMIT, "DRM_IOCTL_QAIC_PARTIAL_EXECUTE_BO"),
        Ioctl(0x46, Kind.WAIT, "DRM_IOCTL_QAIC_WAIT_BO"),
    ),
)
