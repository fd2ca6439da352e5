"""The ``puzzle-nas`` command line.

Each subcommand lives in its own module under ``nas.cli`` with a ``register(subparsers)``
function; the module list is :data:`COMMANDS`. Modules must import lightly (no torch at
import time): heavy imports go inside the command's run function.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pydantic import ValidationError

from hwprofiles.errors import InputError

# (module under nas.cli) in the order they are listed by --help
COMMANDS: list[str] = [
    "search",
    "inspect",
    "hw",
    "cost",
    "solve",
    "build",
    "score",
    "profile",
    "calibrate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="puzzle-nas",
        description="Hardware-aware decomposed NAS (Puzzle) for compressing LLMs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"nas.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad input, 3 infeasible)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except InputError as exc:
        print(f"puzzle-nas {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        print(f"puzzle-nas {args.command}: error: {loc}: {err['msg']}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
