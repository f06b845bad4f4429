"""Intel Xe (include/uapi/drm/xe_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="xe",
    drivers=("xe",),
    header="drm/xe_drm.h",
    ioctls=(
        # VM_BIND (0x45) is not counted: it only maps existing buffers (or user memory) into a VM.
        Ioctl(0x41, Kind.ALLOC, "DRM_IOCTL_XE_GEM_CREATE"),
        Ioctl(0x49, Kind.SUBMIT, "DRM_IOCTL_XE_EXEC"),
        Ioctl(0x4A, Kind.WAIT, "DRM_IOCTL_XE_WAIT_USER_FENCE"),
    ),
)
