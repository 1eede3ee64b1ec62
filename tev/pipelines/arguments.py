"""The command-line options that several commands share: the model pair, truncation of the
target's rows, the tree budget, the training settings and ExitTrain's data.

``tev/cli.py`` and every ``python -m tev bench`` module build their parsers from these, so an
option means the same in every command that offers it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing

from transformers import HfArgumentParser

from tev.engine.auto_budget import AUTO_CAP
from tev.engine.models import DEFAULT_PAIR, PAIRS
from tev.pipelines.exittrain import EXITTRAIN_FLAGS, EXITTRAIN_SETTINGS
from tev.train.data import DOMAINS
from tev.train.loop import TrainSettings

__all__ = ["add_model_arguments", "add_truncation_arguments", "budget_value", "add_budget_cap_argument", "add_training_arguments", "add_data_arguments", "add_folder_argument", "named_folders"]


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


def add_folder_argument(parser: argparse.ArgumentParser) -> None:
    """``--folder NAME=FOLDER`` (repeatable): a drafter saved in a folder, compared under its own name."""
    parser.add_argument("--folder", action="append", metavar="NAME=FOLDER", help="also compare the block or path drafter saved in FOLDER, named NAME (repeatable)")


def named_folders(values: list[str] | None) -> dict[str, str]:
    """``["path10=runs/path-10shard"]`` -> ``{"path10": "runs/path-10shard"}``; a value without ``=`` fails."""
    folders = {}
    for value in values or []:
        name, _, folder = value.partition("=")
        if not name or not folder:
            raise SystemExit(f"--folder takes NAME=FOLDER, got {value!r}")
        folders[name] = folder
    return folders


def add_budget_cap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-cap", type=int, default=AUTO_CAP, help=f"with budget auto: the most nodes a round may keep (default {AUTO_CAP})")


def add_training_arguments(parser, only: tuple[str, ...] = EXITTRAIN_FLAGS, preset: TrainSettings = EXITTRAIN_SETTINGS,
                           preset_name: str = "ExitTrain's preset") -> None:
    """The training settings named in ``only`` as flags, by transformers' HfArgumentParser from
    :class:`TrainSettings` (type, choices, help); an unset flag keeps the command's ``preset``
    (``adapt`` has its own tree term and lambda)."""
    hints = typing.get_type_hints(TrainSettings)
    for setting in dataclasses.fields(TrainSettings):
        if setting.name in only:
            flag = copy.copy(setting)
            flag.type, flag.default = hints[setting.name], None
            flag.metadata = {"help": f"{setting.metadata.get('help', setting.name)} ({preset_name}: {getattr(preset, setting.name)})"}
            HfArgumentParser._parse_dataclass_field(parser, flag)


def add_data_arguments(parser) -> None:
    """ExitTrain's data: a chat pair's shipped conversations (optionally one domain), or the tiny pair's regenerated sequences."""
    parser.add_argument("--domain", choices=DOMAINS, default=None, help="chat pair: train and evaluate on one domain's conversations and prompts (default: all)")
    parser.add_argument("--data-sequences", type=int, default=1024, help="tiny pair: target-regenerated training sequences")
    parser.add_argument("--heldout-sequences", type=int, default=48, help="tiny pair: held-out sequences")
    parser.add_argument("--context-length", type=int, default=128, help="tiny pair: context tokens per sequence")
    parser.add_argument("--new-tokens", type=int, default=96, help="tiny pair: target tokens after the context")
