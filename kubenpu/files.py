"""Small files from trees that an operator or a pod controls (sysfs, /proc, mounted Secrets), and
bounded reads of what a peer sends (an HTTP answer).

Only regular files are read. The type is checked before the open: a FIFO would block the
reader until a writer came, a device could do anything when opened, and a directory cannot be
read at all. It is checked again on the descriptor, in case the path was swapped in between.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class NotRegularFile(OSError):
    """A directory, FIFO, device or socket where a regular file was expected."""


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path` (symlinks followed). Raises OSError,
    NotRegularFile for anything but a regular file; never blocks on the open."""
    _check(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def _check(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
        raise NotRegularFile(errno.EINVAL, f"{kind}, not a regular file")


_CHUNK = 64 << 10


def read_at_most(read: Callable[[int], bytes], limit: int, what: str) -> bytes:
    """All of a stream that holds at most `limit` bytes; ValueError, once past it, naming `what`.
    A peer's answer is as large as the peer likes, and a small gzip body inflates a
    thousandfold: `read(n)` returns at most n bytes (inflated), b"" at the end."""
    chunks, size = [], 0
    while chunk := read(min(_CHUNK, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"{what} is larger than {limit} bytes")
    return b"".join(chunks)
