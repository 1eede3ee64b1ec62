"""The measurement tools that users and CI run, as ``python -m tev bench NAME`` subcommands.

Each tool is a module of this package with ``add_arguments(parser)`` (its options, ``--help``
from its docstring) and ``run(args) -> int`` (the exit status: 0 when it passed).
"""

from __future__ import annotations

import argparse

from tev.bench import drafter_tau, gpu_check, loadtest, page_speed, row_cost, screenshot, workload_path, workload_table

__all__ = ["TOOLS", "add_tools"]

# subcommand -> (module, one line for ``python -m tev bench --help``)
TOOLS = {
    "loadtest": (loadtest, "load test of the app through its public API: users, seeds, own outputs, queue full, memory"),
    "gpu-check": (gpu_check, "one prepared check for a lent CUDA machine (bash scripts/gpu-check.sh runs it)"),
    "page-speed": (page_speed, "the Live page's speed figure, read from a real browser (or --api)"),
    "workload-path": (workload_path, "a visitor's workload path in a real browser: paste, adapt, generate in Live"),
    "drafter-tau": (drafter_tau, "tau of block drafters on the held-out chat prompts, as train-drafter measures it"),
    "workload-table": (workload_table, "the workload ablation tables from result files; --install writes the model card's table"),
    "row-cost": (row_cost, "what a row of the target costs per forward and precision, and which operations keep a row's bits"),
    "screenshot": (screenshot, "the README screenshot (and the other tabs, the walkthrough steps) from the real app"),
}


def add_tools(kinds) -> None:
    """One subparser per tool under ``bench``."""
    for name, (module, summary) in TOOLS.items():
        parser = kinds.add_parser(name, help=summary, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(parser)
        parser.set_defaults(func=_exit_status(module.run))


def _exit_status(run):
    """``run`` as a command: a non-zero status ends the process with it."""

    def command(args: argparse.Namespace) -> None:
        status = run(args)
        if status:
            raise SystemExit(status)

    return command
