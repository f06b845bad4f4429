"""Intel i915 (include/uapi/drm/i915_drm.h).

The DRI1 ioctls (BATCHBUFFER, CMDBUFFER, ALLOC, IRQ_WAIT, ...) and the first GEM_EXECBUFFER are
no-ops or rejected by current kernels and are left out.
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="i915",
    drivers=("i915",),
    header="drm/i915_drm.h",
    ioctls=(
        # Waits until the GPU has caught up with this client's requests older than 20 ms.
        Ioctl(0x58, Kind.WAIT, "DRM_IOCTL_I915_GEM_THROTTLE"),
        Ioctl(0x5B, Kind.ALLOC, "DRM_IOCTL_I915_GEM_CREATE"),
        # i915's CPU-prep: blocks until the GPU is done with the buffer before CPU access.
        Ioctl(0x5F, Kind.WAIT, "DRM_IOCTL_I915_GEM_SET_DOMAIN"),
        # DRM_IOCTL_I915_GEM_EXECBUFFER2_WR shares this nr.
        Ioctl(0x69, Kind.SUBMIT, "DRM_IOCTL_I915_GEM_EXECBUFFER2"),
        Ioctl(0x6C, Kind.WAIT, "DRM_IOCTL_I915_GEM_WAIT"),
        Ioctl(0x73, Kind.ALLOC, "DRM_IOCTL_I915_GEM_USERPTR"),
        Ioctl(0x7C, Kind.ALLOC, "DRM_IOCTL_I915_GEM_CREATE_EXT"),
    ),
)
