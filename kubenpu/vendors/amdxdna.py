"""AMD XDNA (Ryzen AI NPU), amdxdna (include/uapi/drm/amdxdna_accel.h). An accel driver."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="amdxdna",
    drivers=("amdxdna",),
    header="drm/amdxdna_accel.h",
    ioctls=(
        Ioctl(0x43, Kind.ALLOC, "DRM_IOCTL_AMDXDNA_CREATE_BO"),
        Ioctl(0x46, Kind.SUBMIT, "DRM_IOCTL_AMDXDNA_EXEC_CMD"),
        Ioctl(0x49, Kind.WAIT, "DRM_IOCTL_AMDXDNA_WAIT_CMD"),
    ),
)
