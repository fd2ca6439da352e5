"""``torchrun --nproc-per-node N -m nas.scoring SPEC --parent DIR --data TOKENS -o DIR ...``:
the same arguments as ``puzzle-nas score`` (without ``--nproc``), one process per rank."""

import argparse
import sys

from hwprofiles.errors import InputError


def main(argv: list[str] | None = None) -> int:
    from nas.cli.score import add_arguments, run_local

    p = argparse.ArgumentParser(prog="python -m nas.scoring",
                                description="replace-1-block scoring, one rank of torchrun")
    add_arguments(p, launcher=False)
    args = p.parse_args(argv)
    try:
        return run_local(args)
    except InputError as exc:
        print(f"puzzle-nas score: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
