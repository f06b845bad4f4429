"""The loader child: a short-lived process (spawned: a fresh interpreter that inherits no thread
and no BCC) that compiles, loads, attaches and pins a probe, reports, and exits, so that the
agent's own process never maps BCC or LLVM (docs/pinning.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kubenpu.kernel.base import Loader
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.pins import pin_objects


def _load_and_pin(loader: Loader, probe_dir: Path, meta: dict, reply, level: int) -> None:
    """The loader child: compile, load and attach with BCC, pin, report, exit. BCC and LLVM go
    with the child; the pins keep the probe attached."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        attach = loader.start(lambda _: None)
        pinned = pin_objects(loader.objects(), probe_dir, dict(meta, attach=attach))
        reply.send(("pinned" if pinned else "unpinned", attach))
    except ProbeError as err:
        reply.send(("error", str(err)))
    except Exception as err:  # one line for the operator, never a traceback
        reply.send(("error", f"the loader process failed: {err!r}"))


def load_in_child(loader: Loader, probe_dir: Path, meta: dict) -> bool:
    """Load and pin in a short-lived child process (spawned: a fresh interpreter that inherits
    no thread and no BCC). True once pinned; False when the child could not pin (a kprobe
    attach): then the caller loads in its own process. Raises ProbeError with the child's
    one-line error."""
    import multiprocessing  # a cold start only: an adopting restart never loads it

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    level = logging.getLogger().getEffectiveLevel()
    child = ctx.Process(
        target=_load_and_pin, args=(loader, probe_dir, meta, send, level), name="kubenpu-loader"
    )
    child.start()
    send.close()
    try:
        status, text = receive.recv()
    except EOFError:
        status, text = "error", "the loader process died before it reported"
    child.join()
    if status == "error":
        raise ProbeError(text)
    return status == "pinned"


Spawn = Callable[[Loader, Path, dict], bool]  # load_in_child
