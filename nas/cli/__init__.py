"""The ``puzzle-nas`` command line.

Each subcommand lives in its own module under ``nas.cli`` with a ``register(subparsers)``
function; the module list is :data:`COMMANDS`. Modules must import lightly (no torch at
import time): heavy imports go inside the command's run function.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

from nas.launch import HOLDS_A_MODEL, Terminated, unpool_large_allocations

# (module under nas.cli) in the order they are listed by --help
COMMANDS: list[str] = [
    "search",
    "inspect",
    "hw",
    "cost",
    "solve",
    "build",
    "score",
    "distill",
    "iterate",
    "profile",
    "calibrate",
]


EXIT_SIGINT = 128 + signal.SIGINT    # 130, as shells report a Ctrl-C
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def _peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank is gone (its
    process died: gloo's connection to it closed)."""
    dist = sys.modules.get("torch.distributed")
    for cur in _chain(exc):
        if dist is not None and isinstance(cur, getattr(dist, "DistError", ())):
            return True
        # DCP gathers every rank's error: one that lists only other ranks is theirs
        failures = getattr(cur, "failures", None)
        if isinstance(failures, dict) and dist is not None and dist.is_initialized() and \
                dist.get_rank() not in failures:
            return True
        if any(m in str(cur) for m in ("Connection closed by peer", "Connection reset by peer",
                                       "Broken pipe", "Socket Timeout")):
            return True
    return False


def _watch_launcher(interval: float = 0.5) -> None:
    """End this rank (as SIGTERM does: clean-ups run) if its launcher dies, so that no rank
    outlives it even when the launcher is SIGKILLed and cannot stop its ranks."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="puzzle-nas-launcher-watch", daemon=True).start()


def rank_main(command: str, description: str, add_arguments: Callable[..., None],
              run_local: Callable[[argparse.Namespace], int], argv: list[str] | None) -> int:
    """One rank of ``puzzle-nas COMMAND`` (``python -m nas.cli.COMMAND``: its arguments
    without ``--nproc``); bad input is one line and its exit code, as in the CLI. A SIGINT
    or SIGTERM (the launcher's, on the way down) ends it silently with 130 or 143 once its
    clean-ups ran, as does its launcher's death; a collective that fails because another
    rank died ends it silently with :data:`nas.launch.EXIT_PEER_LOST`: the launcher names
    the rank that died, in one line."""
    # torch's import runs Python inside C++ calls, where an exception raised by a signal
    # handler aborts the process ("terminate called after throwing ..."): a signal that
    # lands while torch loads is held until it has loaded
    held: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: held.append(signum))
    import torch.distributed  # noqa: F401

    if held:
        return EXIT_SIGINT if held[0] == signal.SIGINT else EXIT_SIGTERM

    def stop(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)
    try:
        from pydantic import ValidationError

        from hwprofiles.errors import InputError, first_error

        unpool_large_allocations()
        _watch_launcher()
        p = argparse.ArgumentParser(prog=f"python -m nas.cli.{command}",
                                    description=description)
        add_arguments(p, launcher=False)
        args = p.parse_args(argv)
        try:
            return run_local(args)
        except InputError as exc:
            print(f"puzzle-nas {command}: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except ValidationError as exc:
            loc, msg = first_error(exc)
            print(f"puzzle-nas {command}: error: {loc}: {msg}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Terminated, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            sig = _signal_in_chain(exc)
            if sig is not None:
                raise sig from None
            if held:  # the signal's exception, wrapped where the chain does not show it
                return EXIT_SIGINT if held[0] == signal.SIGINT else EXIT_SIGTERM
            if _peer_lost(exc):
                from nas.launch import EXIT_PEER_LOST

                return EXIT_PEER_LOST
            raise
    except KeyboardInterrupt:
        return EXIT_SIGINT
    except Terminated:
        return EXIT_SIGTERM


def build_parser() -> argparse.ArgumentParser:
    from nas import __version__

    parser = argparse.ArgumentParser(
        prog="puzzle-nas",
        description="Hardware-aware decomposed NAS (Puzzle) for compressing LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"puzzle-nas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"nas.cli.{name}").register(sub)
    return parser


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``),
    each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        yield cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__


def _signal_in_chain(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or :class:`Terminated` that ``exc`` was raised from, if any."""
    return next((e for e in _chain(exc) if isinstance(e, (KeyboardInterrupt, Terminated))),
                None)


def _who(args: argparse.Namespace) -> str:
    cmd = getattr(args, "command", None)
    return f"puzzle-nas {cmd}" if cmd else "puzzle-nas"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 a write failed during the run (a full
    disk) or an internal solver error, 2 bad input (an output location that cannot be
    written, found before any work, included), 3 infeasible, 4 a device probe too noisy to
    trust (nothing written), 130 interrupted by SIGINT, 143
    terminated by SIGTERM; an interrupted or failed command leaves nothing half-written:
    every output is a temp file or a staged folder until it is complete)."""
    old_term = None
    try:
        old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave SIGTERM as it is
        pass
    args = argparse.Namespace(command=None)
    try:
        # everything inside the try, imports included (hwprofiles and pydantic take ~1 s):
        # a Ctrl-C at any moment is one line
        from pydantic import ValidationError

        from hwprofiles.errors import InputError, first_error

        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return 2
            if isinstance(getattr(args, "output", None), str) and not args.output.strip():
                # Path("") is the current folder: an empty -o would write (or replace) there
                raise InputError("is empty, expected a path", field="-o/--output")
            if args.command in HOLDS_A_MODEL:
                unpool_large_allocations()
            rc = args.func(args)
        except InputError as exc:
            print(f"puzzle-nas {args.command}: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except ValidationError as exc:
            loc, msg = first_error(exc, "(root)")
            print(f"puzzle-nas {args.command}: error: {loc}: {msg}", file=sys.stderr)
            return 2
        except Exception as exc:
            # a Ctrl-C or SIGTERM that landed inside code which wraps exceptions (an import
            # running a class body: "Error calling __set_name__") is still that signal
            sig = _signal_in_chain(exc)
            if sig is not None:
                raise sig from None
            # a solver answer that breaks a row is a bug, not bad input: one line, exit 1
            # (nas.mip is looked up, not imported: only a command that solved can raise it)
            mip = sys.modules.get("nas.mip.constraints")
            if mip is not None and isinstance(exc, mip.SolverError):
                print(f"puzzle-nas {args.command}: internal solver error (please report "
                      f"it): {exc}", file=sys.stderr)
                return 1
            # a write that failed (full disk, file-size limit, quota): one line, exit 1
            from nas.io import write_failure

            why = write_failure(exc)
            if why is None:
                raise
            out = getattr(args, "output", None) or getattr(args, "out", None)
            where = f"{out}: " if out else ""
            print(f"puzzle-nas {args.command}: error: {where}cannot write ({why}); the "
                  "earlier outputs are as they were, nothing half-written was left behind",
                  file=sys.stderr)
            return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print(f"{_who(args)}: interrupted (SIGINT); nothing half-written was left behind",
              file=sys.stderr)
        return EXIT_SIGINT
    except Terminated:
        print(f"{_who(args)}: terminated (SIGTERM); nothing half-written was left behind",
              file=sys.stderr)
        return EXIT_SIGTERM
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def entry() -> int:
    """``puzzle-nas`` and ``python -m nas``: :func:`main`, then SIGINT ignored for the
    interpreter's teardown.

    Once :func:`main` has returned, the command's outputs are in place and its outcome is
    printed. A Ctrl-C landing in the teardown that follows (joining threads, finalizing
    modules) would otherwise end the process by SIGINT with no word (exit -2, about 1 in 10
    Ctrl-Cs pressed as a short search finishes), as if it had been cut short. A
    KeyboardInterrupt raised between the return and the swap (a few bytecodes) is that same
    late Ctrl-C: the one line, exit 130. SIGTERM keeps its default action, so a teardown
    that hangs can still be stopped."""
    try:
        rc = main()
    except KeyboardInterrupt:
        print("puzzle-nas: interrupted (SIGINT) as it ended; nothing half-written was left "
              "behind", file=sys.stderr)
        rc = EXIT_SIGINT
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass
    return rc
