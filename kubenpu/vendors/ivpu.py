"""Intel NPU, ivpu (include/uapi/drm/ivpu_accel.h). An accel driver; the PCI driver is intel_vpu."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="ivpu",
    drivers=("intel_vpu",),
    header="drm/ivpu_accel.h",
    ioctls=(
        Ioctl(0x42, Kind.ALLOC, "DRM_IOCTL_IVPU_BO_CREATE"),
        Ioctl(0x45, Kind.SUBMIT, "DRM_IOCTL_IVPU_SUBMIT"),
        Ioctl(0x46, Kind.WAIT, "DRM_IOCTL_IVPU_BO_WAIT"),
        Ioctl(0x4D, Kind.SUBMIT, "DRM_IOCTL_IVPU_CMDQ_SUBMIT"),
        Ioctl(0x4E, Kind.ALLOC, "DRM_IOCTL_IVPU_BO_CREATE_FROM_USERPTR"),
    ),
)
