"""The ``python -m tev`` command line."""

from __future__ import annotations

import argparse
import sys

from .bench import add_bench_parser
from .build import add_build_parser
from .cli import add_generate_parser
from .exittrain import add_exittrain_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tev", description="TEV Explorer: exact tree speculative decoding, made visible.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(commands)
    add_bench_parser(commands)
    add_build_parser(commands)
    add_exittrain_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
