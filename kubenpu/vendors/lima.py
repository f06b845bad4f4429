"""Arm Mali Utgard, lima (include/uapi/drm/lima_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="lima",
    drivers=("lima",),
    header="drm/lima_drm.h",
    ioctls=(
        Ioctl(0x41, Kind.ALLOC, "DRM_IOCTL_LIMA_GEM_CREATE"),
        Ioctl(0x43, Kind.SUBMIT, "DRM_IOCTL_LIMA_GEM_SUBMIT"),
        Ioctl(0x44, Kind.WAIT, "DRM_IOCTL_LIMA_GEM_WAIT"),
    ),
)
