"""Arm Mali (Midgard/Bifrost), panfrost (include/uapi/drm/panfrost_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="panfrost",
    drivers=("panfrost",),
    header="drm/panfrost_drm.h",
    ioctls=(
        Ioctl(0x40, Kind.SUBMIT, "DRM_IOCTL_PANFROST_SUBMIT"),
        Ioctl(0x41, Kind.WAIT, "DRM_IOCTL_PANFROST_WAIT_BO"),
        Ioctl(0x42, Kind.ALLOC, "DRM_IOCTL_PANFROST_CREATE_BO"),
    ),
)
