"""kubenpu-agent: discover devices, attach the probe, attribute calls to pods, export counts.

The program: its arguments, the config, the descriptor limit, malloc and the signals.
kubenpu.agent.wiring builds the agent, kubenpu.agent.loop runs it.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import resource
import signal
import sys
from pathlib import Path

from kubenpu import __version__
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.pins import uninstall
from kubenpu.services import Services

try:  # `pip install kubenpu` (kubenpuctl only) lacks these: main() says so in one line
    from kubenpu import config, export
    from kubenpu.agent.wiring import build
except ModuleNotFoundError as exc:
    if (exc.name or "").startswith("kubenpu"):
        raise
    _MISSING_EXTRAS: ModuleNotFoundError | None = exc
else:
    _MISSING_EXTRAS = None

log = logging.getLogger("kubenpu")

# Stopping the probe, the CRI lookups and the exporters (a final OTLP push) together takes at
# most this long: within Kubernetes' default 30 s grace period before SIGKILL.
_STOP_SECONDS = 25.0


def raise_nofile() -> int:
    """Raise the soft descriptor limit to the hard one (a container's soft limit is often
    1,024); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("descriptor limit raised from %d to %d", soft, hard)
    return hard


# glibc's mallopt parameters (malloc.h), each with the variable that sets it at exec, and ours.
_MALLOPT = {
    # glibc raises its mmap threshold to the largest block freed (up to 32 MiB): after one
    # scrape's megabytes of text, such blocks come from the heap and stay there. Fixed at
    # glibc's default, they are mapped and unmapped.
    "MALLOC_MMAP_THRESHOLD_": (-3, 128 * 1024),
    "MALLOC_ARENA_MAX": (-8, 2),  # not 8 per core: the agent's threads share 2
}


def bound_malloc(libc: object | None = None) -> list[str]:
    """Keep glibc from holding memory the agent freed (_MALLOPT): with 1,000 timed pods, RSS
    84.7 -> 74.4 MiB (docs/performance.md). A variable set in the environment wins. Returns the
    variables set here; none where the C library has no mallopt (musl)."""
    mallopt = getattr(libc or ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return []
    return [
        name
        for name, (param, value) in _MALLOPT.items()
        if name not in os.environ and mallopt(param, value) == 1
    ]


def _uninstall(pin_dir: str | None, config_file: str) -> int:
    """--uninstall: the pin directory is --pin-dir, else the config file's probe.pin_dir when
    that file exists; no config file is needed. Says what it removed, or that there was nothing."""
    if pin_dir is None and Path(config_file).exists():
        try:
            pin_dir = config.load(config_file).probe.pin_dir
        except config.ConfigError as err:
            for problem in err.problems:
                print(f"kubenpu-agent: {problem}", file=sys.stderr)
            return 2
    if not pin_dir:
        print("kubenpu-agent: nothing to remove: no pin directory (pass --pin-dir DIR)")
        return 0
    root = Path(pin_dir)
    try:
        n = uninstall(root)
    except OSError as err:
        print(f"kubenpu-agent: cannot remove {root}: {err}", file=sys.stderr)
        return 1
    print(
        f"kubenpu-agent: removed {n} pinned probe(s) from {root}"
        if n
        else f"kubenpu-agent: nothing pinned in {root}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    if _MISSING_EXTRAS is not None:
        print("kubenpu-agent needs the agent extras: pip install 'kubenpu[agent]'", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="kubenpu-agent", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        default=config.DEFAULT_PATH,
        help=f"YAML config file (default {config.DEFAULT_PATH}; without it, the defaults)",
    )
    parser.add_argument(
        "--check-config", metavar="FILE", help="validate FILE, print the effective config"
    )
    parser.add_argument("--debug", action="store_true", help="debug logs and BCC's verifier log")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="print every counted call as a JSON line (switches the probe to events mode)",
    )
    parser.add_argument(
        "--uninstall",
        action="store_true",
        help="remove the probes pinned in --pin-dir or probe.pin_dir (detaching them) and exit",
    )
    parser.add_argument(
        "--pin-dir",
        metavar="DIR",
        help="with --uninstall: the pin directory (default: probe.pin_dir of --config, if found)",
    )
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    if args.pin_dir is not None and not args.uninstall:
        parser.error("--pin-dir goes with --uninstall")
    if args.uninstall:
        return _uninstall(args.pin_dir, args.config)
    if args.check_config:
        return config.check_config(args.check_config, export.certs.problems, export.check)
    path = config.path_to_load(args.config)
    try:
        cfg = config.load(path, checks=export.check)  # the checks of --check-config
    except config.ConfigError as err:
        for problem in err.problems:
            print(f"kubenpu-agent: {problem}", file=sys.stderr)
        return 2
    level = logging.DEBUG if args.debug else getattr(logging, cfg.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if path is None:
        log.info(
            "no config file at %s: running on the defaults (and OTEL_* variables)",
            config.DEFAULT_PATH,
        )
    try:
        if args.trace:
            cfg.probe.mode = "events"
        raise_nofile()  # before the metrics server sizes its connection cap from it
        bound_malloc()
        with Services(_STOP_SECONDS) as services:
            agent = build(cfg, services, args.debug, args.trace)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: agent.stop.set())
            return agent.run()
    except (ProbeError, export.ExportError) as err:
        log.error("%s", err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
