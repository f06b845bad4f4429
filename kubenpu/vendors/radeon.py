"""AMD radeon (include/uapi/drm/radeon_drm.h).

The UMS ioctls (CP_*, VERTEX, INDIRECT, CMDBUF, ALLOC, IRQ_WAIT, SURF_ALLOC, ...) are rejected
by the KMS driver and are left out.
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="radeon",
    drivers=("radeon",),
    header="drm/radeon_drm.h",
    ioctls=(
        Ioctl(0x5D, Kind.ALLOC, "DRM_IOCTL_RADEON_GEM_CREATE"),
        # radeon's CPU-prep: blocks until the GPU is done with the buffer before CPU access.
        Ioctl(0x63, Kind.WAIT, "DRM_IOCTL_RADEON_GEM_SET_DOMAIN"),
        Ioctl(0x64, Kind.WAIT, "DRM_IOCTL_RADEON_GEM_WAIT_IDLE"),
        Ioctl(0x66, Kind.SUBMIT, "DRM_IOCTL_RADEON_CS"),
        Ioctl(0x6D, Kind.ALLOC, "DRM_IOCTL_RADEON_GEM_USERPTR"),
    ),
)
