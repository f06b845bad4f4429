"""Arm Mali (CSF), panthor (include/uapi/drm/panthor_drm.h). Its ioctls are enum constants.

Panthor has no wait ioctl of its own: clients wait on syncobjs (counted in the core table).
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="panthor",
    drivers=("panthor",),
    header="drm/panthor_drm.h",
    ioctls=(
        Ioctl(0x45, Kind.ALLOC, "DRM_IOCTL_PANTHOR_BO_CREATE"),
        Ioctl(0x49, Kind.SUBMIT, "DRM_IOCTL_PANTHOR_GROUP_SUBMIT"),
        # A tiler heap is GPU memory the kernel allocates in chunks on the client's behalf.
        Ioctl(0x4B, Kind.ALLOC, "DRM_IOCTL_PANTHOR_TILER_HEAP_CREATE"),
    ),
)
