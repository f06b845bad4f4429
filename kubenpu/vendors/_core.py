"""DRM core ioctls (include/uapi/drm/drm.h), shared by every DRM and accel driver.

Not counted: GEM_OPEN and PRIME_FD_TO_HANDLE only import existing buffers; WAIT_VBLANK waits for
the display, not for submitted work; SYNCOBJ_EVENTFD and SYNCOBJ_QUERY never block. The DRI1
AGP_ALLOC, SG_ALLOC and DMA ioctls exist only for legacy drivers current kernels no longer ship.
"""

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
