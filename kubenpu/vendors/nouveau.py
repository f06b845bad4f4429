"""NVIDIA nouveau (include/uapi/drm/nouveau_drm.h). Its GEM ioctls start at 0x40 + 0x40."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="nouveau",
    drivers=("nouveau",),
    header="drm/nouveau_drm.h",
    ioctls=(
        # VM_BIND (0x51) and SVM_BIND (0x49) are not counted: they map or migrate existing memory.
        Ioctl(0x52, Kind.SUBMIT, "DRM_IOCTL_NOUVEAU_EXEC"),
        Ioctl(0x80, Kind.ALLOC, "DRM_IOCTL_NOUVEAU_GEM_NEW"),
        Ioctl(0x81, Kind.SUBMIT, "DRM_IOCTL_NOUVEAU_GEM_PUSHBUF"),
        Ioctl(0x82, Kind.WAIT, "DRM_IOCTL_NOUVEAU_GEM_CPU_PREP"),
    ),
)
