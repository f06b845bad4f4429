"""Intel Gaudi, habanalabs (include/uapi/drm/habanalabs_accel.h). An accel driver."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="habanalabs",
    drivers=("habanalabs",),
    header="drm/habanalabs_accel.h",
    ioctls=(
        # CB and MEMORY each multiplex create/destroy/map operations; creating command buffers
        # and device memory is what they exist for, so both count as alloc.
        Ioctl(0x41, Kind.ALLOC, "DRM_IOCTL_HL_CB"),
        Ioctl(0x42, Kind.SUBMIT, "DRM_IOCTL_HL_CS"),
        Ioctl(0x43, Kind.WAIT, "DRM_IOCTL_HL_WAIT_CS"),
        Ioctl(0x44, Kind.ALLOC, "DRM_IOCTL_HL_MEMORY"),
    ),
)
