"""DRM core ioctls (include/uapi/drm/drm.h), shared by every DRM and accel driver."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="drm",
    drivers=(),
    header="drm/drm.h",
    ioctls=(
        Ioctl(0xB2, Kind.ALLOC, "DRM_IOCTL_MODE_CREATE_DUMB"),
        Ioctl(0xC3, Kind.WAIT, "DRM_IOCTL_SYNCOBJ_WAIT"),
        Ioctl(0xCA, Kind.WAIT, "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT"),
    ),
)
