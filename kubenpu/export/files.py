"""The exporters' secrets and TLS files, read once at start: regular files of bounded size."""

from __future__ import annotations

import os
import stat

from kubenpu.export.errors import ExportError

MAX_FILE = 1 << 20  # a PEM chain is a few KiB


def read_regular(path: str, what: str, limit: int = MAX_FILE) -> bytes:
    """The file's bytes. ExportError unless it is a regular file of at most `limit` bytes: a
    FIFO or a device would block the start, or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block
    except OSError as err:
        raise ExportError(f"cannot read {what} {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ExportError(f"{what} {path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ExportError(f"{what} {path} is larger than {limit} bytes")
    return data
