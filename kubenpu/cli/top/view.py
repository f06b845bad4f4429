"""kubenpuctl top's live view: curses, key presses, a frame every interval."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import curses
from kubenpu.cli.top.frames import NUMERIC, SORT_KEYS, Frame, build_frame
from kubenpu.cli.top.render import header, table
from kubenpu.cli.top.sources import Source, TopError

# Every key the view handles -> what it does: a sort's name (SORTS), "reverse" or "quit". key()
# dispatches from this table and HELP is built from it, so the help cannot leave a key out.
KEYS: dict[str, str] = {**SORT_KEYS, "r": "reverse", "q": "quit"}
ALIASES = {"Q": "q", "\x1b": "q"}  # Esc and Q also quit; the help names q alone
HELP = "keys: " + " ".join(f"{key} {does}" for key, does in KEYS.items())


@dataclass
class _View:
    source: Source
    interval: float
    sort: str
    reverse: bool = False
    frame: Frame | None = None
    error: str = ""
    next_read: float = 0.0

    def step(self, now: float) -> None:
        """Read the source when a read is due at `now`; a failed read is shown, not raised."""
        if now < self.next_read:
            return
        try:
            self.frame, self.error = build_frame(self.source.read(), self.source.multi_node), ""
        except TopError as e:
            self.error = str(e)
        self.next_read = now + self.interval

    def key(self, ch: int) -> bool:
        """Apply a key press; False means quit."""
        c = chr(ch) if 0 <= ch < 256 else ""
        does = KEYS.get(ALIASES.get(c, c))
        if does == "quit":
            return False
        if does == "reverse":
            self.reverse = not self.reverse
        elif does is not None:
            self.sort, self.reverse = does, False
        return True

    def lines(self, width: int, height: int) -> tuple[list[str], int]:
        """The screen's lines, and the index of the column titles' line."""
        assert self.frame is not None
        multi = self.source.multi_node
        top = header(self.frame, self.source, self.interval)
        if self.error:
            top.append(f"last read failed: {self.error}; retrying every {self.interval:g}s")
        body = table(self.frame, self.sort, width, self.reverse, multi)
        space = max(height - len(top) - 2, 2)  # a blank line, and the key help at the bottom
        if len(body) > space:
            body = [*body[: space - 1], f"... {len(body) - space + 1} more rows"]
        order = "descending" if (self.sort in NUMERIC) != self.reverse else "ascending"
        lines = [*top, "", *body][: height - 1]
        lines += [""] * (height - 1 - len(lines))  # the keys on the bottom line
        return [*lines, f"sort {self.sort} {order} | {HELP}"], len(top) + 1


def live(source: Source, interval: float, sort: str) -> None:
    """The curses view until q or Ctrl-C. The first read happens before the screen is taken,
    so a dead endpoint is one line on the terminal; later failures show in the header."""
    try:  # here, not at the top: a Python built without curses still runs kubenpuctl
        import curses
    except ImportError:
        raise TopError("this Python has no curses module; use --once") from None
    view = _View(source, interval, sort)
    view.frame = build_frame(source.read(), source.multi_node)
    view.next_read = time.monotonic() + interval
    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(_loop, view)


def _loop(screen: curses.window, view: _View) -> None:
    import curses

    with contextlib.suppress(curses.error):  # terminals without cursor control
        curses.curs_set(0)
    while True:
        view.step(time.monotonic())
        _draw(screen, view)
        screen.timeout(max(0, int((view.next_read - time.monotonic()) * 1000)))
        ch = screen.getch()
        if ch != -1 and not view.key(ch):
            return


def _draw(screen: curses.window, view: _View) -> None:
    import curses

    height, width = screen.getmaxyx()
    screen.erase()
    lines, titles = view.lines(width - 1, height)
    for y, line in enumerate(lines):
        attr = {0: curses.A_REVERSE, titles: curses.A_BOLD}.get(y, curses.A_NORMAL)
        with contextlib.suppress(curses.error):  # a terminal shrinking under us
            screen.addnstr(y, 0, line, width - 1, attr)
    screen.refresh()
