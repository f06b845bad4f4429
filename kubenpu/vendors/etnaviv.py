"""Vivante, etnaviv (include/uapi/drm/etnaviv_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="etnaviv",
    drivers=("etnaviv",),
    header="drm/etnaviv_drm.h",
    ioctls=(
        Ioctl(0x42, Kind.ALLOC, "DRM_IOCTL_ETNAVIV_GEM_NEW"),
        Ioctl(0x44, Kind.WAIT, "DRM_IOCTL_ETNAVIV_GEM_CPU_PREP"),
        Ioctl(0x46, Kind.SUBMIT, "DRM_IOCTL_ETNAVIV_GEM_SUBMIT"),
        Ioctl(0x47, Kind.WAIT, "DRM_IOCTL_ETNAVIV_WAIT_FENCE"),
        Ioctl(0x48, Kind.ALLOC, "DRM_IOCTL_ETNAVIV_GEM_USERPTR"),
        Ioctl(0x49, Kind.WAIT, "DRM_IOCTL_ETNAVIV_GEM_WAIT"),
    ),
)
