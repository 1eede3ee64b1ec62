"""The app's live ExitTrain mode: a few minutes of fine-tuning a pair's shipped base drafter on
its shipped ExitTrain data, measured on held-out rounds (``python -m tev bench exittrain --live``,
in :mod:`tev.bench.ablation`, measures what that mode gains).

The default (chat) pair fine-tunes on one domain's conversations (dialogue, code or math) and is
judged on that domain's held-out conversations: the same anchors before and after, so the
change in ``1 + C`` is a paired difference with its own standard error
(:class:`tev.train.experiment.Experiment`). The tiny pair fine-tunes on its corpus sequences
(``assets/models/exittrain-data.safetensors``, written by ``build-assets``).
"""

from __future__ import annotations

import dataclasses

import torch

from tev.engine.block_drafter import BlockDrafter
from tev.train.data import TrainData, load_train_data
from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
from tev.pipelines.exittrain_data import load_chat_exittrain_data
from tev.train.experiment import Experiment
from tev.train.loop import TrainSettings
from tev.util.paths import models_dir

__all__ = ["LIVE_SETTINGS", "CHAT_LIVE_SETTINGS", "live_settings", "live_data", "live_experiment"]

# Calibrated on a 2-core CPU: 300 steps of the tiny pair take about 70 s; lr 1e-3 (60 steps) lowered tau by 16%.
LIVE_SETTINGS = dataclasses.replace(EXITTRAIN_SETTINGS, steps=300, warmup=5, sequences_per_step=2, anchors_per_sequence=8, eval_every=0, save_every=0)
# The default pair: about 4 s a step on a 2-core CPU (two target forwards of two conversations and 32 trees), so
# 36 steps fit in the 3 minutes the tab allows.
CHAT_LIVE_SETTINGS = dataclasses.replace(LIVE_SETTINGS, steps=36, lr=1e-4, warmup=3, anchors_per_sequence=16)


def live_settings(chat: bool) -> TrainSettings:
    return CHAT_LIVE_SETTINGS if chat else LIVE_SETTINGS


def live_data(bundle, domain: str | None = None) -> tuple[TrainData, TrainData]:
    """(train, held-out) of a pair's live mode: the default pair's conversations of ``domain``
    (all when None), or the tiny pair's shipped sequences."""
    if bundle.has_domains:
        return load_chat_exittrain_data(domain)
    path = models_dir() / "exittrain-data.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"the live ExitTrain data is missing ({path}); rebuild it with `python -m tev build-assets`")
    parts = load_train_data(path)
    return parts["train"], parts["heldout"]


def live_experiment(bundle, settings: TrainSettings, data: tuple[TrainData, TrainData]) -> Experiment:
    """Before -> train -> after of a fresh float32 copy of the pair's shipped base drafter on ``data``."""
    drafter = BlockDrafter.from_pretrained(bundle.shipped_folder("block"), bundle.target, dtype=torch.float32)
    return Experiment.exittrain(bundle.target, drafter, data[0], data[1], settings)
