"""Broadcom V3D, Raspberry Pi 4 and later (include/uapi/drm/v3d_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="v3d",
    drivers=("v3d",),
    header="drm/v3d_drm.h",
    ioctls=(
        Ioctl(0x40, Kind.SUBMIT, "DRM_IOCTL_V3D_SUBMIT_CL"),
        Ioctl(0x41, Kind.WAIT, "DRM_IOCTL_V3D_WAIT_BO"),
        Ioctl(0x42, Kind.ALLOC, "DRM_IOCTL_V3D_CREATE_BO"),
        Ioctl(0x46, Kind.SUBMIT, "DRM_IOCTL_V3D_SUBMIT_TFU"),
        Ioctl(0x47, Kind.SUBMIT, "DRM_IOCTL_V3D_SUBMIT_CSD"),
        # CPU jobs run in the GPU's job queue (timestamp queries, indirect compute dispatch).
        Ioctl(0x4B, Kind.SUBMIT, "DRM_IOCTL_V3D_SUBMIT_CPU"),
    ),
)
