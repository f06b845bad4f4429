"""kubenpu.files and kubenpu.text: reading untrusted trees, printing untrusted names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubenpu.files import NotRegularFile, read_regular
from kubenpu.text import iec_bytes, printable


def test_reads_a_regular_file_up_to_the_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    assert read_regular(tmp_path / "f", 4) == b"0123"
    assert read_regular(str(tmp_path / "f"), 100) == b"0123456789"


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.mkdir(), "a directory"),
        (os.mkfifo, "a FIFO"),
        (lambda p: p.symlink_to("/dev/null"), "a character device"),
    ],
)
def test_anything_but_a_regular_file_is_refused_unopened(tmp_path: Path, make, kind: str) -> None:
    path = tmp_path / "x"
    make(path)
    with pytest.raises(NotRegularFile) as err:
        read_regular(path, 10)  # a FIFO opened for reading would block here
    assert err.value.strerror == f"{kind}, not a regular file"


def test_missing_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "none", 10)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1.0KiB"),
        (1536, "1.5KiB"),
        ((1 << 20) - 1, "1.0MiB"),  # 1023.999 KiB rounds into the next unit, not to 1024KiB
        (256 << 20, "256MiB"),
        (3 << 29, "1.5GiB"),
        (1 << 70, "1048576PiB"),
    ],
)
def test_bytes_are_iec(n: int, text: str) -> None:
    assert iec_bytes(n) == text


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable("trainer-0 é") == "trainer-0 é"
    assert printable("a\x1b[2Jb\nc\u202ed\x7f") == "a\\x1b[2Jb\\nc\\u202ed\\x7f"
