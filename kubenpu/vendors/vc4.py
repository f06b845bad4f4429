"""Broadcom VC4, Raspberry Pi 0-3 (include/uapi/drm/vc4_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="vc4",
    drivers=("vc4-drm", "vc4"),
    header="drm/vc4_drm.h",
    ioctls=(
        Ioctl(0x40, Kind.SUBMIT, "DRM_IOCTL_VC4_SUBMIT_CL"),
        Ioctl(0x41, Kind.WAIT, "DRM_IOCTL_VC4_WAIT_SEQNO"),
        Ioctl(0x42, Kind.WAIT, "DRM_IOCTL_VC4_WAIT_BO"),
        Ioctl(0x43, Kind.ALLOC, "DRM_IOCTL_VC4_CREATE_BO"),
        Ioctl(0x45, Kind.ALLOC, "DRM_IOCTL_VC4_CREATE_SHADER_BO"),
    ),
)
