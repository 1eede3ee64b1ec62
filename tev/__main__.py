"""The ``python -m tev`` command line."""

from __future__ import annotations

import argparse
import sys

from .bench import add_bench_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tev", description="TEV Explorer: exact tree speculative decoding, made visible.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
