"""ExitTrain's trainer: exit-guided fine-tuning of the block drafter (the loss is in ``exit_loss``).

For each training anchor the drafter's current (detached) marginals build the DDTree tree
inference would build; the frozen target scores that realized tree with tree attention, giving
``P``, ``rho`` and the exit law ``w`` (all detached), and ``L = L_tok + lambda * L_exit`` trains
the drafter. Per step, one causal target forward over a batch of target-regenerated sequences
fills a KV cache and gives the drafter's input features; then ONE more forward per sequence
appends its anchors' trees (``anchors_per_sequence`` of them) with a tree-attention mask.
Checkpoints are safetensors plus JSON, swapped in whole (a killed run keeps its last one).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator

import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, get_cosine_with_min_lr_schedule_with_warmup

from tev.core.tree import DraftTree
from tev.engine.block_drafter import BlockDrafter
from tev.train.anchor_data import AnchorData
from tev.train.exit_loss import IGNORE, WEIGHT_MODES, TreeBatch, score_trees, soft_token_loss, token_loss, tree_node_loss
from tev.util.files import atomic_folder, recover_folder

__all__ = ["ExitTrainConfig", "ExitTrainer", "AnchorBatch", "ProgressEvent", "MIN_LR_RATE"]

MIN_LR_RATE = 0.1  # the cosine schedule decays to this share of the peak lr
TOKEN_LABELS = ("soft", "written")


def _option(default, help: str | None = None, **cli):
    """A config field whose metadata describes its command-line flag (``help``, and optionally
    ``flag`` and ``choices``); read by the CLI's dataclass-to-argparse helper."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class ExitTrainConfig:
    """ExitTrain settings (all on the command line)."""

    weights: str = _option("exit", "exit (w, the paper), prefix (ablation), none (token-only), reach (floored P, the official code's default), exit-depth (w * d)", choices=WEIGHT_MODES)
    steps: int = _option(400, "optimizer steps")
    budget: int = _option(32, "budget B of the training trees")
    lambda_exit: float = _option(16.0, "weight of L_exit", flag="--lambda")
    temperature: float = _option(1.0, "target temperature for the exit law (P, rho, w)")
    lr: float = _option(2e-4, "peak learning rate (linear warm-up, then cosine decay to a tenth of it)")
    warmup: int = _option(20, "warm-up steps")
    sequences_per_step: int = _option(4, "target-regenerated sequences per step")
    anchors_per_sequence: int = _option(8, "anchors (training trees) per sequence")
    token_labels: str = _option("soft", "L_tok's labels: soft (the target's next-token distribution, as the shipped drafters learn) or written (its continuation's tokens)", choices=TOKEN_LABELS)
    soft_top: int = _option(16, "soft labels keep the target's top-k over the draft vocabulary, renormalised (train-drafter's default)")
    eval_every: int = _option(50, "steps between held-out 1 + C measurements (0: never)")
    save_every: int = _option(100, "steps between checkpoints (0: never)")
    seed: int = _option(0)

    def __post_init__(self):
        problems = []
        if self.weights not in WEIGHT_MODES:
            problems.append(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {self.weights!r}")
        if self.token_labels not in TOKEN_LABELS:
            problems.append(f"token_labels must be one of {', '.join(TOKEN_LABELS)}, got {self.token_labels!r}")
        for name in ("steps", "budget", "sequences_per_step", "anchors_per_sequence", "soft_top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an integer >= 1, got {value!r}")
        for name, low in (("lambda_exit", 0.0), ("lr", 0.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (name == "lr" and value == 0):
                problems.append(f"{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}, got {value!r}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature <= 0:
            problems.append(f"temperature must be > 0 (the exit law needs a sampling target), got {self.temperature!r}")
        for name in ("warmup", "eval_every", "save_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{name} must be an integer >= 0, got {value!r}")
        if problems:
            raise ValueError("bad ExitTrain config: " + "; ".join(problems))

    @classmethod
    def from_args(cls, args) -> "ExitTrainConfig":
        """The config from parsed command-line options; fields without an option keep their default."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


@dataclass
class ProgressEvent:
    """One training step's numbers (and, every ``eval_every`` steps, held-out ones)."""

    step: int
    steps: int
    loss: float
    loss_tok: float
    loss_exit: float
    expected_tau: float  # mean 1 + C(T) of this step's realized trees
    heldout_expected_tau: float | None = None
    seconds: float = 0.0
    lr: float = 0.0


@dataclass
class AnchorBatch:
    """One batch of anchors: the drafter's logits, its realized trees scored by the target, and
    the token labels. ``M = s * A`` anchors (``s`` sequences x ``A`` anchors each)."""

    draft_logits: torch.Tensor  # [M, K, Vd] over the draft vocabulary, with gradient when training
    scored: TreeBatch  # tree m is the one inference would build from draft_logits[m]
    labels: torch.Tensor  # [M, K] draft-vocabulary positions of the continuation (IGNORE past the end or outside it)
    soft_labels: torch.Tensor | None  # [M, K, Vd], the target's distribution over the draft vocabulary at each label


class ExitTrainer:
    """Fine-tunes a :class:`BlockDrafter` with ExitTrain on token sequences.

    Args:
        target: the frozen target (its parameters are never updated).
        drafter: the block drafter to train (in place).
        sequences: `LongTensor[S, T]` training sequences (context + target continuation), or
            :class:`AnchorData` (padded conversations, each with its own first anchor).
        heldout: optional held-out sequences (the same kinds) for the periodic held-out ``1 + C``.
        first_anchor: the first anchor position (the last context position) of tensor sequences.
        accelerator: an ``accelerate.Accelerator`` (one CPU process when None).
    """

    def __init__(self, config: ExitTrainConfig, target, drafter: BlockDrafter, sequences: torch.Tensor, heldout: torch.Tensor | None = None, first_anchor: int = 0, accelerator: Accelerator | None = None):
        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.target = target.to(self.accelerator.device).eval()
        for parameter in self.target.parameters():
            parameter.requires_grad_(False)
        self.sequences = AnchorData.of(sequences, first_anchor)
        self.heldout = None if heldout is None else AnchorData.of(heldout, first_anchor)
        self.horizon = drafter.config.horizon
        self.window = drafter.config.context_window
        self.feature_layers = list(drafter.config.feature_layers)
        self.raw_drafter = drafter
        optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
        self.drafter, self.optimizer = self.accelerator.prepare(drafter, optimizer)
        rank = self.accelerator.process_index
        self.generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
        self.step = 0
        self.scheduler = self._lr_schedule(self.step)
        self.history: list[dict] = []
        self._cancel = threading.Event()

    # ------------------------------------------------------------------ control
    def cancel(self) -> None:
        """Stop after the current step (safe to call from another thread)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _lr_schedule(self, step: int):
        """Linear warm-up, then cosine decay to ``MIN_LR_RATE`` of the peak; positioned so the
        next optimizer step (number ``step``, from 0) uses its lr."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # the one accelerate wraps
        return get_cosine_with_min_lr_schedule_with_warmup(optimizer, self.config.warmup, self.config.steps, min_lr_rate=MIN_LR_RATE, last_epoch=step - 1)

    # ------------------------------------------------------------------ one batch
    def _sample(self, data: AnchorData, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence rows `[s]`, anchor positions `[s, A]`), each row's anchors sorted and distinct."""
        config = self.config
        count = min(config.sequences_per_step, len(data))
        rows = torch.randperm(len(data), generator=generator)[:count]
        spans = data.spans[rows]
        per = min(config.anchors_per_sequence, int(spans.min()))
        anchors = torch.stack([torch.randperm(int(span), generator=generator)[:per] for span in spans]) + data.first_anchors[rows, None]
        return rows, anchors.sort(dim=1).values

    def _features_window(self, features: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features `[s, T, F]`, anchors `[s, A]` -> windows `[s*A, W, F]`, valid `[s*A, W]`."""
        offsets = torch.arange(-self.window + 1, 1, device=features.device)
        positions = anchors[..., None].to(features.device) + offsets  # [s, A, W]
        valid = positions >= 0
        rows = torch.arange(features.shape[0], device=features.device)[:, None, None]
        windows = features[rows, positions.clamp(min=0)] * valid[..., None]
        return windows.flatten(0, 1), valid.flatten(0, 1)

    def _forward_batch(self, data: AnchorData, rows: torch.Tensor, anchors: torch.Tensor, train: bool) -> AnchorBatch:
        """Drafter logits, the realized trees' target quantities and the token labels."""
        device = self.accelerator.device
        chosen = data.select(rows)
        batch = chosen.ids.to(device)  # [s, T], trimmed to the longest chosen row
        lengths = chosen.lengths.to(device)
        cache = DynamicCache(config=self.target.config)
        with torch.no_grad():
            out = self.target(input_ids=batch, cache=cache, use_cache=True, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1).float()  # [s, T, F]
            target_logits = out.logits.float()  # [s, T, V]
        windows, valid = self._features_window(features, anchors)
        anchor_flat = anchors.to(device)
        root_ids = batch.gather(1, anchor_flat + 1).flatten()  # [s*A]
        with torch.set_grad_enabled(train):
            draft_logits = self.drafter(windows, valid, root_ids, full_vocab=False)  # [s*A, K, Vd]
        # realized trees from the current drafter (detached), one target forward per sequence
        logq = self.raw_drafter.full_vocab(torch.log_softmax(draft_logits.detach().float(), dim=-1)).cpu()  # [s*A, K, V]
        per = anchors.shape[1]
        scored = []
        for i in range(batch.shape[0]):
            seq_trees, roots = [], []
            for a in range(per):
                m = i * per + a
                root_position = int(anchors[i, a]) + 1
                room = self.target.config.max_position_embeddings - 1 - root_position
                depth = max(0, min(self.horizon, room))
                seq_trees.append(DraftTree.from_marginals(logq[m, :depth], self.config.budget, root_token=int(root_ids[m])))
                roots.append(root_position)
            scored.append(score_trees(self.target, batch[i], _select_row(cache, i), target_logits[i, roots], seq_trees, roots, self.config.temperature))
        label_positions = anchor_flat.unsqueeze(-1) + 2 + torch.arange(self.horizon, device=device)  # [s, A, K]
        in_range = label_positions < lengths[:, None, None]
        at = label_positions.clamp(max=batch.shape[1] - 1)
        labels = batch.unsqueeze(1).expand(-1, per, -1).gather(2, at)
        labels = torch.where(in_range, labels, torch.full_like(labels, IGNORE)).flatten(0, 1)  # [s*A, K]
        labels = self.raw_drafter.draft_positions(labels, missing=IGNORE)
        soft = None
        if self.config.token_labels == "soft":
            # the target's distribution at each label's position (what it conditions the label on), over the draft vocabulary
            rows_of = torch.arange(batch.shape[0], device=device)[:, None, None]
            label_logits = target_logits[rows_of, at - 1]  # [s, A, K, V]
            if self.raw_drafter.draft_vocab is not None:
                label_logits = label_logits[..., self.raw_drafter.draft_vocab.to(device)]
            probs = torch.softmax(label_logits, dim=-1)
            top = probs.topk(min(self.config.soft_top, probs.shape[-1]), dim=-1)
            probs = torch.zeros_like(probs).scatter_(-1, top.indices, top.values / top.values.sum(-1, keepdim=True))
            soft = probs.flatten(0, 1) * in_range.flatten(0, 1)[..., None]  # zero rows: unlabelled
        return AnchorBatch(draft_logits, TreeBatch.join(scored), labels, soft)

    def _loss(self, batch: AnchorBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``L``, ``L_tok``, ``L_exit``) of one batch."""
        draft_logits, scored = batch.draft_logits, batch.scored
        loss_tok = token_loss(draft_logits, batch.labels) if batch.soft_labels is None else soft_token_loss(draft_logits, batch.soft_labels)
        if self.config.weights != "none":
            loss_exit = tree_node_loss(draft_logits, scored, list(range(len(scored.trees))), self.config.weights, self.raw_drafter.draft_positions)
        else:
            loss_exit = draft_logits.sum() * 0.0
        return loss_tok + self.config.lambda_exit * loss_exit, loss_tok, loss_exit

    def train_step(self) -> ProgressEvent:
        start = time.perf_counter()
        self.drafter.train()
        lr = self.scheduler.get_last_lr()[0]
        rows, anchors = self._sample(self.sequences, self.generator)
        batch = self._forward_batch(self.sequences, rows, anchors, train=True)
        loss, loss_tok, loss_exit = self._loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.drafter.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return ProgressEvent(
            step=self.step, steps=self.config.steps, loss=loss.item(), loss_tok=loss_tok.item(), loss_exit=loss_exit.item(),
            expected_tau=batch.scored.expected_tau, seconds=time.perf_counter() - start, lr=lr,
        )

    @torch.no_grad()
    def heldout_trees(self, batches: int = 4, seed: int = 12345, should_stop=None) -> TreeBatch | None:
        """The current drafter's trees on held-out sequences (fixed anchors: the same rounds every
        call), scored by the target; None when ``should_stop()`` turned true between batches."""
        if self.heldout is None:
            raise ValueError("no held-out sequences")
        self.drafter.eval()
        generator = torch.Generator().manual_seed(seed)
        parts = []
        for _ in range(batches):
            if should_stop is not None and should_stop():
                return None
            rows, anchors = self._sample(self.heldout, generator)
            parts.append(self._forward_batch(self.heldout, rows, anchors, train=False).scored)
        return TreeBatch.join(parts)

    def heldout_expected_tau(self, batches: int = 4, seed: int = 12345) -> float:
        """Mean ``1 + C(T)`` of the current drafter's trees on held-out sequences (fixed anchors)."""
        if self.heldout is None:
            return float("nan")
        return self.heldout_trees(batches, seed).expected_tau

    def run(self, checkpoint_dir: Path | None = None, deadline: float | None = None) -> Iterator[ProgressEvent]:
        """Train until ``config.steps``, :meth:`cancel`, or ``deadline`` (a ``time.monotonic()``
        value: no step starts after it); yields one event per step."""
        config = self.config
        while self.step < config.steps and not self.cancelled and (deadline is None or time.monotonic() < deadline):
            event = self.train_step()
            if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.steps):
                event.heldout_expected_tau = self.heldout_expected_tau()
            self.history.append(asdict(event))
            if checkpoint_dir is not None and config.save_every and (self.step % config.save_every == 0 or self.step == config.steps):
                self.save_checkpoint(checkpoint_dir)
            yield event

    # ------------------------------------------------------------------ checkpoints (safetensors only)
    def save_checkpoint(self, folder: Path) -> None:
        """Write ``folder/checkpoint`` whole: a complete new folder, then renames."""
        if not self.accelerator.is_main_process:
            return
        with atomic_folder(Path(folder) / "checkpoint") as staging:
            self._write_checkpoint(staging)

    def _write_checkpoint(self, staging: Path) -> None:
        drafter = self.accelerator.unwrap_model(self.drafter)
        drafter.save_pretrained(staging)
        state = {}
        names = {id(p): n for n, p in drafter.named_parameters()}
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                for key, value in optimizer.state.get(parameter, {}).items():
                    if torch.is_tensor(value):
                        state[f"{names[id(parameter)]}::{key}"] = value.detach().cpu().contiguous()
        state["__generator__"] = self.generator.get_state()
        state["__weights_fp32__"] = torch.cat([p.detach().float().flatten().cpu() for p in drafter.parameters()])
        save_file(state, staging / "trainer_state.safetensors")
        (staging / "trainer_state.json").write_text(json.dumps({"step": self.step, "config": asdict(self.config), "history": self.history}, indent=1))

    def load_checkpoint(self, folder: Path) -> bool:
        """Resume from ``folder/checkpoint`` if it exists; returns whether it did."""
        final = Path(folder) / "checkpoint"
        recover_folder(final)
        if not (final / "trainer_state.json").is_file():
            return False
        meta = json.loads((final / "trainer_state.json").read_text())
        state = load_file(final / "trainer_state.safetensors")
        drafter = self.accelerator.unwrap_model(self.drafter)
        flat = state.pop("__weights_fp32__")
        offset = 0
        with torch.no_grad():
            for parameter in drafter.parameters():
                count = parameter.numel()
                parameter.copy_(flat[offset : offset + count].view_as(parameter))
                offset += count
        self.generator.set_state(state.pop("__generator__"))
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        by_name = dict(drafter.named_parameters())
        for key, value in state.items():
            name, slot = key.split("::")
            parameter = by_name[name]
            optimizer.state.setdefault(parameter, {})[slot] = value.to(parameter.device)
        self.step = int(meta["step"])
        self.scheduler = self._lr_schedule(self.step)
        self.history = meta.get("history", [])
        return True


def _select_row(cache: DynamicCache, row: int) -> DynamicCache:
    """A new cache holding batch row ``row`` of ``cache`` (so trees can be appended to it)."""
    single = DynamicCache(config=None)
    for index, layer in enumerate(cache.layers):
        single.update(layer.keys[row : row + 1], layer.values[row : row + 1], index)
    return single
