"""vgem, the virtual GEM provider (include/uapi/drm/vgem_drm.h). A platform (or faux) device."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="vgem",
    drivers=("vgem", "faux_driver"),
    header="drm/vgem_drm.h",
    ioctls=(
        # Attaching a fence marks a buffer as being written by (simulated) device work.
        Ioctl(0x41, Kind.SUBMIT, "DRM_IOCTL_VGEM_FENCE_ATTACH"),
    ),
)
