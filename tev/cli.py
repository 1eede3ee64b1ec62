"""The ``python -m tev`` command line: the one place that builds the argument parser.

Each command lives in its own module as a plain function of the parsed options; this module
only declares the options and wires each subcommand to its function.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import typing

import torch
from transformers import HfArgumentParser

from tev.bench.ablation import ablation_command, live_check_command
from tev.bench.e2e import e2e_command
from tev.bench.reach import reach_command
from tev.bench.report import FULL, QUICK, report_command
from tev.bench.tools import add_tools
from tev.bench.verifiers_bench import verifiers_command
from tev.core.verify import VERIFIERS
from tev.engine.auto_budget import AUTO_CAP
from tev.engine.generate_command import generate_command
from tev.engine.models import DEFAULT_PAIR, DRAFTERS, PAIRS
from tev.pipelines.build import build_assets_command
from tev.pipelines.exittrain import EXITTRAIN_FLAGS, EXITTRAIN_SETTINGS, exittrain_command
from tev.pipelines.exittrain_data import exittrain_data_command
from tev.pipelines.migrate import migrate_command
from tev.pipelines.train_drafter import train_drafter_command
from tev.pipelines.workload import DEFAULT_ANSWER_LAW, DEFAULT_TREE_TERM, EXIT_LAMBDA, EXIT_TERM, workload_command, workload_settings
from tev.pipelines.workload_report import LAWS
from tev.train.data import DOMAINS
from tev.train.loop import TrainSettings
from tev.train.losses import TREE_TERMS
from tev.util.stored import VERSIONS

__all__ = ["build_parser", "main"]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", choices=PAIRS, default=None, help="shipped pair when no --target is given: " + "; ".join(f"{p.name}: {p.description}" for p in PAIRS.values()) + f" (default: $TEV_PAIR or {DEFAULT_PAIR.name})")
    parser.add_argument("--target", help="target model: a local folder or a Hugging Face id (default: the pair's target)")
    parser.add_argument("--draft", help="drafter: a block-drafter folder or a causal LM folder / HF id (default: embedded drafters)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--device-map", default=None, help="'auto' to spread a large target over devices (accelerate)")
    parser.add_argument("--allow-download", action="store_true", help="let Hugging Face ids download (default: offline, cache only)")


def add_truncation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--top-k``, ``--top-p``, ``--min-p``: the target's rows truncated as Hugging Face ``generate``
    does, before every verifier (each stays exact for the truncated law)."""
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens at each step (0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most likely tokens until their mass reaches p (1: all)")
    parser.add_argument("--min-p", type=float, default=0.0, help="keep tokens at least min-p times as likely as the most likely one (0: all)")


def budget_value(text: str) -> int | str:
    """A ``--budget`` value: a node count, or ``auto`` (the cost-aware rule, see ``--budget-cap``)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a budget is a whole number of nodes or 'auto', got {text!r}") from None


def add_budget_cap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-cap", type=int, default=AUTO_CAP, help=f"with budget auto: the most nodes a round may keep (default {AUTO_CAP})")


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


def _add_bench_verifiers(kinds) -> None:
    parser = kinds.add_parser("verifiers", help="time the verifier-decision stage on synthetic trees")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[8192, 151936])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the full result to this JSON file")
    parser.set_defaults(func=verifiers_command)


def _add_bench_e2e(kinds) -> None:
    parser = kinds.add_parser("e2e", help="end-to-end speed: autoregressive vs chain vs DDTree+predraw vs DDTree+TEV")
    parser.add_argument("--budgets", type=budget_value, nargs="+", default=[8, 16, 32, 64], help="node counts and/or auto")
    add_budget_cap_argument(parser)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--methods", nargs="+", default=None, metavar="DRAFTER+VERIFIER", help="the project's methods to run (default: chain+tev block+predraw block+tev path+tev, each where the pair has its drafter; at T = 0 each runs greedy)")
    add_truncation_arguments(parser)
    parser.add_argument("--prompts", default=None, help="prompt set in assets/prompts: chat (dialogue, code, math; the default for a chat target), heldout, humaneval")
    parser.add_argument("--num-prompts", type=int, default=12, help="prompts used, spread evenly over the set (and so over its domains)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--forwards", nargs="+", default=["chosen"], choices=["chosen", "transformers", "float32", "bfloat16"],
                        help="target forwards to run the methods and the autoregressive loop in, interleaved (chosen: the one chosen at load; float32/bfloat16: row-invariant)")
    parser.add_argument("--peers", nargs="+", default=["hf-generate", "hf-prompt-lookup"], choices=["hf-generate", "hf-prompt-lookup", "hf-generate-bf16"],
                        help="Hugging Face generate peers (hf-generate-bf16: on a bfloat16 copy of the target)")
    parser.add_argument("--json", help="also write the full result to this JSON file")
    add_model_arguments(parser)
    parser.set_defaults(func=e2e_command)


def _add_training_arguments(parser, only: tuple[str, ...] = EXITTRAIN_FLAGS) -> None:
    """The training settings named in ``only`` as flags, by transformers' HfArgumentParser from
    :class:`TrainSettings` (type, choices, help); an unset flag keeps the command's preset
    (``--workload`` has its own tree term and lambda)."""
    hints = typing.get_type_hints(TrainSettings)
    for setting in dataclasses.fields(TrainSettings):
        if setting.name in only:
            flag = copy.copy(setting)
            flag.type, flag.default = hints[setting.name], None
            flag.metadata = {"help": f"{setting.metadata.get('help', setting.name)} (ExitTrain's preset: {getattr(EXITTRAIN_SETTINGS, setting.name)})"}
            HfArgumentParser._parse_dataclass_field(parser, flag)


def _add_data_arguments(parser) -> None:
    """ExitTrain's data: a chat pair's shipped conversations (optionally one domain), or the tiny pair's regenerated sequences."""
    parser.add_argument("--domain", choices=DOMAINS, default=None, help="chat pair: train and evaluate on one domain's conversations and prompts (default: all)")
    parser.add_argument("--data-sequences", type=int, default=1024, help="tiny pair: target-regenerated training sequences")
    parser.add_argument("--heldout-sequences", type=int, default=48, help="tiny pair: held-out sequences")
    parser.add_argument("--context-length", type=int, default=128, help="tiny pair: context tokens per sequence")
    parser.add_argument("--new-tokens", type=int, default=96, help="tiny pair: target tokens after the context")


def _bench_exittrain(args) -> None:
    """``bench exittrain``: the ablation, or with ``--live`` a check of the app's live mode."""
    (live_check_command if args.live else ablation_command)(args)


def _add_bench_exittrain(kinds) -> None:
    parser = kinds.add_parser("exittrain", help="ExitTrain evaluation: base vs token-only vs prefix vs exit weights, equal steps and data")
    parser.add_argument("--tree-terms", nargs="+", choices=TREE_TERMS, default=["none", "prefix", "exit"], help="one trained drafter per tree term")
    _add_training_arguments(parser, tuple(f for f in EXITTRAIN_FLAGS if f not in ("tree_term", "eval_every", "save_every")))
    _add_data_arguments(parser)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--base", help="drafter folder to start from (default: the pair's block drafter)")
    parser.add_argument("--out", help="folder for the trained drafters and exittrain-eval.json (default: runs/exittrain-eval-<time>)")
    parser.add_argument("--live", action="store_true", help="instead: the app's 1-2 minute live mode, once per --live-seeds, tau change at B=32")
    parser.add_argument("--live-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--install", action="store_true", help="ship the exit-weighted drafter of this run as the pair's ExitTrain drafter (with its evaluation)")
    add_model_arguments(parser)
    parser.set_defaults(func=_bench_exittrain)


def _add_bench_report(kinds) -> None:
    parser = kinds.add_parser("report", help="check the paper's claims on a model pair; writes report.md/json and plots")
    parser.add_argument("--quick", action="store_true", help="a couple of minutes: few prompts, trees, draws and budgets")
    parser.add_argument("--prompts", default="heldout", help="prompt set in assets/prompts (heldout, humaneval)")
    parser.add_argument("--prompts-file", help="JSON prompts instead of a named set: a list of {id, text} (or a dict with 'prompts')")
    parser.add_argument("--num-prompts", type=int, default=None, help=f"prompts used (default {FULL.num_prompts}, {QUICK.num_prompts} with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exittrain-results", help="JSON from `python -m tev bench exittrain` (rows of base/none/prefix/exit tau) for claim 5")
    parser.add_argument("--e2e-results", help="JSON from `python -m tev bench e2e --json OUT.json` for claim 7 (instead of the report's own shorter run)")
    parser.add_argument("--workload-results", nargs="+", help="JSON files from `python -m tev exittrain --workload PACK.json --json OUT.json` (one per pack) for claim 5b")
    parser.add_argument("--out", help="output folder (default: runs/report-<YYYYmmdd-HHMMSS>)")
    add_model_arguments(parser)
    parser.set_defaults(func=report_command)


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks (verifiers, e2e, exittrain, report) and the tools users and CI run (loadtest, gpu-check, ...)")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    _add_bench_verifiers(kinds)
    _add_bench_e2e(kinds)
    _add_bench_exittrain(kinds)
    _add_bench_report(kinds)
    add_tools(kinds)  # the tools users and CI run: loadtest, gpu-check, page-speed, ...
    _add_bench_reach(kinds)


def _add_bench_reach(kinds) -> None:
    parser = kinds.add_parser("reach", help="where drafters lose reach, depth by depth: teacher-forced accuracy and chain reach, accepted depths while decoding")
    parser.add_argument("--pair", choices=PAIRS, default=None, help="shipped pair (default: $TEV_PAIR or the first)")
    parser.add_argument("--drafters", nargs="*", default=["block"], help="the pair's drafter kinds to compare (default: block)")
    parser.add_argument("--folder", action="append", metavar="NAME=FOLDER", help="also compare the block or path drafter saved in FOLDER, named NAME (repeatable)")
    parser.add_argument("--num-prompts", type=int, default=8, help="held-out chat prompts, spread over the domains")
    parser.add_argument("--budgets", nargs="+", default=["auto", "16"], help="budgets to decode at (auto or node counts)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report as JSON here")
    parser.set_defaults(func=reach_command)


def _exittrain(args) -> None:
    """``exittrain``: on the pair's own data, or with ``--workload`` on a user's prompts."""
    (workload_command if args.workload else exittrain_command)(args)


def _add_exittrain(commands) -> None:
    parser = commands.add_parser("exittrain", help="fine-tune the block drafter with ExitTrain (exit-weighted loss)")
    _add_training_arguments(parser)
    _add_data_arguments(parser)
    parser.add_argument("--base", help="drafter folder to start from (default: the pair's block drafter; with --workload, the drafter the page starts with: the path drafter on the default pair)")
    parser.add_argument("--out", help="output folder (default: runs/exittrain/<weights>-<time>); never assets/ unless --install")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    parser.add_argument("--install", action="store_true", help="install the result as the pair's ExitTrain drafter")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts for the before/after tau (0: skip)")
    workload = parser.add_argument_group("workload adaptation (with --workload: of the options above only --tree-term, --lambda-tree, --seed, --base and --out apply; "
                                         f"the default recipe is the ExitTrain tab's: --tree-term {DEFAULT_TREE_TERM} (the token loss alone), with the {EXIT_TERM} term at lambda {EXIT_LAMBDA:g} as the control)")
    workload.add_argument("--workload", help="JSON list of your own user messages (at least 16): adapt the drafter to them and measure the gain on a held-out quarter")
    workload.add_argument("--json", help="where to write the result (default: <out>/result.json)")
    workload.add_argument("--minutes", type=float, default=5.0, help="time budget of the whole run (answers, fine-tunes, controls and held-out measurement): it measures its pace and plans within it")
    workload.add_argument("--workload-steps", type=int, default=workload_settings().steps, help="fine-tune steps (fewer if the time budget ends first)")
    workload.add_argument("--answer-law", default=DEFAULT_ANSWER_LAW,
                          help="the law the target's training answers are drawn from: T0 greedy, T0.7 (top-p 0.9) or T1 sampled, or several joined by '+' "
                               "(T0+T0.7: each training prompt answered at each)")
    workload.add_argument("--controls", nargs="*", default=None, help="tree terms trained on the same data, steps and seed, for comparison, within the minutes when they fit "
                          "(none: the token-only control; default: the other recipe, the exit term beside the token loss alone and the token loss alone beside a tree term)")
    add_model_arguments(parser)
    parser.set_defaults(func=_exittrain)


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
    parser = commands.add_parser("migrate", help="rewrite stored results written before they carried a schema into today's names, once")
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
