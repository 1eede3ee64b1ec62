"""The ``python -m tev`` command line: the one place that builds the argument parser.

Each command lives in its own module as a plain function of the parsed options; this module
only declares the options and wires each subcommand to its function.
"""

from __future__ import annotations

import argparse
import sys

from tev.bench import ablation, adapted_coverage, data_writer, drafter_tau, e2e, oracle_reach, reach, report, row_cost, verifiers_bench, workload_table
from tev.core.verify import VERIFIERS
from tev.drive import gpu_check, loadtest, page_load, page_speed, screenshot, workload_path
from tev.engine.generate_command import generate_command
from tev.engine.models import DRAFTERS
from tev.pipelines.arguments import add_budget_cap_argument, add_data_arguments, add_model_arguments, add_training_arguments, add_truncation_arguments, budget_value
from tev.pipelines.build import build_assets_command
from tev.pipelines.exittrain import exittrain_command
from tev.pipelines.exittrain_data import exittrain_data_command
from tev.pipelines.migrate import migrate_command
from tev.pipelines.train_drafter import train_drafter_command
from tev.pipelines.workload import DEFAULT_ANSWER_LAW, DEFAULT_TREE_TERM, EXIT_LAMBDA, EXIT_TERM, workload_command, workload_settings
from tev.util.stored import VERSIONS

__all__ = ["BENCH", "build_parser", "main"]

# ``python -m tev bench NAME``: the one table of bench subcommands, NAME -> (module, one line for ``--help``).
# Each module has ``add_arguments(parser)`` (its options; its docstring is the subcommand's description)
# and ``run(args)`` (None or 0 when it passed, else the exit status).
BENCH = {
    # the paper's benchmarks and measurements of the library (tev/bench)
    "verifiers": (verifiers_bench, "time the verifier-decision stage on synthetic trees"),
    "e2e": (e2e, "end-to-end speed: autoregressive vs chain vs DDTree+predraw vs DDTree+TEV"),
    "exittrain": (ablation, "ExitTrain evaluation: base vs token-only vs prefix vs exit weights, equal steps and data"),
    "report": (report, "check the paper's claims on a model pair; writes report.md/json and plots"),
    "reach": (reach, "how deep drafts are accepted, depth by depth: teacher-forced top-1 accuracy and top-1 chain depth, accepted depths while decoding"),
    "oracle-reach": (oracle_reach, "the oracle bound: the target's own best-first tree of B nodes beside each drafter's, 1 + C per law and budget"),
    "adapted-coverage": (adapted_coverage, "an adapted drafter against its base on the same contexts: 1 + C on the target's own answers to held-out workload prompts, per law, paired"),
    "drafter-tau": (drafter_tau, "tau of block drafters on the held-out chat prompts, as train-drafter measures it"),
    "workload-table": (workload_table, "the workload ablation tables from result files; --install writes the model card's table"),
    "row-cost": (row_cost, "what a row of the target costs per forward and precision, and which operations keep a row's bits"),
    "data-writer": (data_writer, "response tokens a second of the drafter's data writers: continuous batching against the batch writer"),
    # what starts the app or drives it from outside (tev/drive)
    "loadtest": (loadtest, "load test of the app through its public API: users, seeds, own outputs, queue full, memory"),
    "page-speed": (page_speed, "the Live page's speed figure, read from a real browser (or --api)"),
    "page-load": (page_load, "what a streaming answer costs the browser: long tasks on the page's main thread"),
    "workload-path": (workload_path, "a visitor's workload path in a real browser: paste, adapt, generate in Live"),
    "screenshot": (screenshot, "the README screenshot (and the other tabs, the walkthrough steps) from the real app"),
    "gpu-check": (gpu_check, "one prepared check for a lent CUDA machine (bash scripts/gpu-check.sh runs it)"),
}


def _add_generate(commands) -> None:
    parser = commands.add_parser("generate", help="generate text with tree speculation (or --ar)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--drafter", choices=list(DRAFTERS), default=None,
                        help="; ".join(f"{kind}: {entry.label}" for kind, entry in DRAFTERS.items()) + " (default: the pair's default drafter, else block)")
    parser.add_argument("--verifier", choices=VERIFIERS, default="tev", help="at temperature 0 the greedy verifier is used")
    parser.add_argument("--ar", action="store_true", help="plain autoregressive decoding (the baseline)")
    parser.add_argument("--budget", type=budget_value, default=16, help="draft-tree budget B (non-root nodes; 16, the fastest of 8, 16 and 32 in docs/benchmarks.md that still draws a tree worth reading), or auto: each round keeps the drafter's best nodes this machine pays for")
    add_budget_cap_argument(parser)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy decoding (the default); > 0 samples")
    add_truncation_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop", action="append", help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="print token ids, text, per-round block lengths, coverage and timings as JSON")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_true", default=None, help="send the prompt as a user message through the chat template (the default for chat models)")
    mode.add_argument("--raw", dest="chat", action="store_false", help="continue the prompt text as it is (no chat template)")
    add_model_arguments(parser)
    parser.set_defaults(func=generate_command)


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks (verifiers, e2e, exittrain, report, ...) and the tools that drive the app (loadtest, page-speed, ...)")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    for name, (module, summary) in BENCH.items():
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


def _exittrain(args) -> None:
    """``exittrain``: the ExitTrain fine-tune on the pair's own data; ``--workload`` moved to ``adapt``."""
    if args.workload:
        raise ValueError("workload adaptation is its own command now: python -m tev adapt --workload FILE.json (the same options)")
    exittrain_command(args)


def _add_exittrain(commands) -> None:
    parser = commands.add_parser("exittrain", help="the ExitTrain method: fine-tune the block drafter on the pair's own data with the exit-weighted tree loss")
    add_training_arguments(parser)
    add_data_arguments(parser)
    parser.add_argument("--base", help="drafter folder to start from (default: the pair's block drafter)")
    parser.add_argument("--out", help="output folder (default: runs/exittrain/<weights>-<time>); never assets/ unless --install")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    parser.add_argument("--install", action="store_true", help="install the result as the pair's ExitTrain drafter")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts for the before/after tau (0: skip)")
    parser.add_argument("--workload", help=argparse.SUPPRESS)  # moved: refused with the name of `adapt`
    add_model_arguments(parser)
    parser.set_defaults(func=_exittrain)


def _add_adapt(commands) -> None:
    parser = commands.add_parser("adapt", help="workload adaptation: fine-tune the drafter the page starts with on your own prompts and measure the gain on a held-out quarter",
                                 description=f"The default recipe is the ExitTrain tab's: --tree-term {DEFAULT_TREE_TERM} (the token loss alone), "
                                             f"with the {EXIT_TERM} term at lambda {EXIT_LAMBDA:g} as the control.")
    parser.add_argument("--workload", required=True, help="JSON list of your own user messages (at least 16): adapt the drafter to them and measure the gain on a held-out quarter")
    add_training_arguments(parser, only=("tree_term", "lambda_tree", "seed"), preset=workload_settings(), preset_name="the workload recipe")
    parser.add_argument("--base", help="drafter folder to start from (default: the drafter the page starts with: the path drafter on the default pair)")
    parser.add_argument("--out", help="output folder for the adapted drafter (default: runs/workload/<pack>-<time>); never assets/")
    parser.add_argument("--json", help="where to write the result (default: <out>/result.json)")
    parser.add_argument("--minutes", type=float, default=5.0, help="time limit of the whole run (answers, fine-tunes, controls and held-out measurement): it measures its pace and plans within it")
    parser.add_argument("--workload-steps", type=int, default=workload_settings().steps, help="fine-tune steps (fewer if the minutes end first)")
    parser.add_argument("--answer-law", default=DEFAULT_ANSWER_LAW,
                        help="the law the target's training answers are drawn from: T0 greedy, T0.7 (top-p 0.9) or T1 sampled, or several joined by '+' "
                             "(T0+T0.7: each training prompt answered at each)")
    parser.add_argument("--controls", nargs="*", default=None, help="tree terms trained on the same data, steps and seed, for comparison, within the minutes when they fit "
                        "(none: the token-only control; default: the other recipe, the exit term beside the token loss alone and the token loss alone beside a tree term)")
    add_model_arguments(parser)
    parser.set_defaults(func=workload_command)


def _add_exittrain_data(commands) -> None:
    parser = commands.add_parser("exittrain-data", help="write the default pair's ExitTrain data from a finished train-drafter run's conversations")
    parser.add_argument("--work-dir", default="runs/train-drafter-smollm2", help="the train-drafter work folder (its cached conversations and split)")
    parser.add_argument("--per-domain", type=int, default=128, help="training conversations per domain (dialogue, code, math)")
    parser.add_argument("--response-tokens", type=int, default=128, help="response tokens kept per conversation")
    parser.add_argument("--out", default=None, help="file to write (default: assets/models/smollm2/exittrain-data.safetensors)")
    parser.set_defaults(func=exittrain_data_command)


def _add_build_assets(commands) -> None:
    parser = commands.add_parser("build-assets", help="rebuild the embedded tokenizer, target, drafter, prompts and model card")
    parser.add_argument("--quick", action="store_true", help="a miniature build in seconds (for tests)")
    parser.add_argument("--out", default=None, help="assets folder to install into (default: the repo's assets/, or $TEV_ASSETS_DIR)")
    parser.add_argument("--work-dir", default=None, help="stage cache (default: runs/build-assets, or runs/build-assets-quick)")
    parser.add_argument("--fresh", action="store_true", help="ignore cached stages")
    parser.set_defaults(func=build_assets_command)


def _add_train_drafter(commands) -> None:
    parser = commands.add_parser("train-drafter", help="train a block drafter for a chat target (self-instruct data, self-distillation)")
    parser.add_argument("--target", default=None, help="target: a local folder or a Hugging Face id (Llama/Qwen architecture with a chat template; default: SmolLM2-135M-Instruct)")
    parser.add_argument("--out", required=True, help="folder to install the drafter into (drafter.safetensors, drafter_config.json, training.json)")
    parser.add_argument("--work-dir", default=None, help="stage cache, resumable (default: runs/train-drafter-<out name>)")
    parser.add_argument("--quick", action="store_true", help="a miniature run in seconds (for tests)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--shards", type=int, default=None, help="shards of self-instruct conversations (default: the recipe's); more shards add data, the cached ones are kept")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--soft-top", type=int, default=None, help="labels: the target's top-k distribution over the draft vocabulary (0: the tokens it wrote; default: the recipe's)")
    parser.add_argument("--conditioning", choices=("marginal", "path"), default=None,
                        help="marginal: the block drafter's K per-depth marginals in one pass; path: each depth reads the drafted tokens above it (default: the recipe's)")
    parser.add_argument("--hidden", dest="hidden_size", type=int, default=None, help="drafter width (default: the recipe's)")
    parser.add_argument("--layers", dest="num_layers", type=int, default=None, help="drafter blocks (default: the recipe's)")
    parser.add_argument("--heads", dest="num_heads", type=int, default=None, help="attention heads per block; must divide --hidden (default: the recipe's)")
    parser.add_argument("--intermediate", dest="intermediate_size", type=int, default=None, help="MLP width (default: the recipe's)")
    parser.add_argument("--allow-download", action="store_true", help="let a Hugging Face id download (default: offline, cache only)")
    parser.set_defaults(func=train_drafter_command)


def _add_migrate(commands) -> None:
    parser = commands.add_parser("migrate", help="rewrite stored results written before they carried a schema, or under an older version of it, into today's names, once")
    parser.add_argument("paths", nargs="+", help="result files, or folders (every *.json under them), e.g. assets docs runs")
    parser.add_argument("--kind", choices=tuple(VERSIONS), default=None, help="the files' kind (default: read from each file)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    parser.set_defaults(func=migrate_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tev", description="TEV Explorer: exact tree speculative decoding, made visible.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_generate(commands)
    _add_bench(commands)
    _add_build_assets(commands)
    _add_exittrain(commands)
    _add_adapt(commands)
    _add_exittrain_data(commands)
    _add_train_drafter(commands)
    _add_migrate(commands)
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
