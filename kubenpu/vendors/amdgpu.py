"""AMD amdgpu (include/uapi/drm/amdgpu_drm.h).

USERQ_SIGNAL and USERQ_WAIT are not counted: they only exchange fences for user-mode queues, whose
work is submitted through doorbells the kernel never sees, and USERQ_WAIT does not block.
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="amdgpu",
    drivers=("amdgpu",),
    header="drm/amdgpu_drm.h",
    ioctls=(
        Ioctl(0x40, Kind.ALLOC, "DRM_IOCTL_AMDGPU_GEM_CREATE"),
        Ioctl(0x44, Kind.SUBMIT, "DRM_IOCTL_AMDGPU_CS"),
        Ioctl(0x47, Kind.WAIT, "DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE"),
        Ioctl(0x49, Kind.WAIT, "DRM_IOCTL_AMDGPU_WAIT_CS"),
        Ioctl(0x51, Kind.ALLOC, "DRM_IOCTL_AMDGPU_GEM_USERPTR"),
        Ioctl(0x52, Kind.WAIT, "DRM_IOCTL_AMDGPU_WAIT_FENCES"),
    ),
)
