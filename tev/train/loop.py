"""The one drafter training loop, its settings, optimizer, schedule and checkpoint.

Per step ``L = L_tok + lambda_tree * L_tree`` (:mod:`tev.train.losses`). The trees of the tree
term are fixed (``trees="fixed"``: scored once, :func:`tev.train.trees.fixed_trees`; the token
loss then reads every anchor of the data) or on-policy (``trees="on-policy"``: each step draws
``sequences_per_step`` rows and ``anchors_per_sequence`` anchors of each, the current drafter's
trees there are scored by the target, and both losses read those anchors: ExitTrain).

:func:`train` is a generator of step records: the caller decides between steps (a server's
:class:`~tev.util.compute_thread.ComputeThread` takes a step in turn with other users' rounds; the
caller stops at a deadline or on cancel). The anchors of step ``s`` come
from a generator seeded with ``(seed, s)``, so a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Literal, get_args

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from tev.engine.block_drafter import BlockDrafterConfig, default_feature_layers
from tev.train.data import IGNORE, TrainData
from tev.train.losses import TREE_TERMS, TreeTerm, token_losses, tree_loss
from tev.train.trees import ScoredTrees, draft_logits, on_policy
from tev.util.files import atomic_folder, recover_folder

__all__ = ["TrainSettings", "TREE_MODES", "drafter_shape", "fit_to_target", "optimizer_for", "schedule_for", "save_checkpoint", "install_drafter", "load_checkpoint", "train", "with_progress", "heldout_loss", "anchor_token_loss"]

TreeMode = Literal["fixed", "on-policy"]  # trees scored once, or redrawn from the current drafter every step
TREE_MODES = get_args(TreeMode)
MIN_LR_RATE = 0.1  # the cosine schedule decays to this share of the peak lr


@dataclass(frozen=True)
class TrainSettings:
    """How a block drafter is trained (one class for every use; presets beside each use)."""

    # ``help`` is what the command line shows (transformers' HfArgumentParser reads it)
    steps: int = field(default=100, metadata={"help": "optimizer steps"})
    batch: int = 64  # token-loss anchors per step (fixed trees; on-policy steps use their drawn anchors)
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate (linear warm-up, then cosine decay to a tenth of it)"})
    warmup: int = field(default=100, metadata={"help": "warm-up steps"})
    seed: int = 0
    weight_decay: float = 0.01
    short_history_share: float = 0.1  # anchors that see only a few features (a prompt's first rounds)
    save_every: int = field(default=0, metadata={"help": "steps between checkpoints (0: only at the end)"})
    eval_every: int = field(default=0, metadata={"help": "steps between held-out measurements, when held-out data is given (0: never)"})
    soft_top: int = field(default=0, metadata={"help": "labels: the target's top-k laws over the draft vocabulary (0: the tokens it wrote)"})
    tree_term: TreeTerm = field(
        default="none", metadata={"help": "tree term added to the token loss (exit: the method; none: token loss only)"})
    lambda_tree: float = field(default=0.1, metadata={"help": "weight of the tree term against the token loss"})
    trees: TreeMode = "fixed"  # scored once, or redrawn from the current drafter every step
    tree_batch: int = 16  # fixed trees per step
    budget: int = field(default=16, metadata={"help": "budget B (nodes) of the training trees"})
    temperature: float = field(default=1.0, metadata={"help": "target temperature of the trees' exit law (P, rho, w)"})
    sequences_per_step: int = field(default=4, metadata={"help": "on-policy: sequences drawn per step"})
    anchors_per_sequence: int = field(default=8, metadata={"help": "on-policy: anchors (training trees) per sequence"})

    def __post_init__(self):
        if self.tree_term not in TREE_TERMS:
            raise ValueError(f"tree term must be one of {', '.join(TREE_TERMS)}, got {self.tree_term!r}")
        if self.trees not in TREE_MODES:
            raise ValueError(f"trees must be one of {', '.join(TREE_MODES)}, got {self.trees!r}")
        for name in ("steps", "batch", "tree_batch", "budget", "sequences_per_step", "anchors_per_sequence"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("warmup", "save_every", "eval_every", "soft_top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name, low, strict in (("lr", 0.0, True), ("lambda_tree", 0.0, False), ("temperature", 0.0, True), ("weight_decay", 0.0, False)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (strict and value == low):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")


def drafter_shape(**shape) -> BlockDrafterConfig:
    """A drafter's shape (a :class:`BlockDrafterConfig`) before its target is known: the target's
    own fields (vocabulary, width, layers, feature layers) are filled in by :func:`fit_to_target`."""
    return BlockDrafterConfig(vocab_size=0, target_hidden_size=0, feature_layers=[], **shape)


def fit_to_target(shape: BlockDrafterConfig, target, **fields) -> BlockDrafterConfig:
    """``shape`` with ``target``'s own fields (head rows, width, layers, the default feature layers) and ``fields``."""
    layers = target.config.num_hidden_layers
    return replace(shape, vocab_size=target.get_output_embeddings().weight.shape[0], target_hidden_size=target.config.hidden_size,
                   feature_layers=default_feature_layers(layers), target_num_layers=layers, **fields)


def optimizer_for(drafter, settings: TrainSettings) -> torch.optim.AdamW:
    """The drafters' one optimizer: AdamW with betas (0.9, 0.95) over the trainable parameters."""
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95))
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", settings.lr)  # lets the schedule start at a resumed step
    return optimizer


def schedule_for(optimizer, warmup: int, steps: int, step: int = 0):
    """Linear warm-up, then cosine decay to a tenth of the peak; the next step (``step``) uses its lr."""
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, steps, min_lr_rate=MIN_LR_RATE, last_epoch=step - 1)


def save_checkpoint(folder: Path, drafter, optimizer: torch.optim.Optimizer, step: int, history: list[dict], settings: TrainSettings | None = None) -> None:
    """Drafter weights and AdamW moments as safetensors, the step and history as JSON, swapped in whole."""
    names = {id(p): name for name, p in drafter.named_parameters()}
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in drafter.state_dict().items()}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"{key}.{names[id(parameter)]}"] = state[key].contiguous()
    with atomic_folder(folder) as staging:
        save_file(tensors, staging / "checkpoint.safetensors")
        meta = {"step": step, "history": history, **({"settings": asdict(settings)} if settings else {})}
        (staging / "checkpoint.json").write_text(json.dumps(meta))


def install_drafter(drafter, destination: Path, extra_files: dict[str, str] | None = None) -> None:
    """Save ``drafter`` (and ``extra_files``, name -> text) as ``destination``, swapped in whole."""
    with atomic_folder(destination) as staging:
        drafter.save_pretrained(staging)
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text)


def checkpoint_history(folder: Path) -> tuple[int, list[dict]]:
    """(step, history) of the checkpoint in ``folder`` without loading its tensors; (0, []) when none.
    After a run resumed from a checkpoint, the whole run's records are here, not only the last part's."""
    recover_folder(folder)
    if not (folder / "checkpoint.json").is_file():
        return 0, []
    meta = json.loads((folder / "checkpoint.json").read_text())
    return meta["step"], meta["history"]


def load_checkpoint(folder: Path, drafter, optimizer: torch.optim.Optimizer) -> tuple[int, list[dict]]:
    """(step, history) of the checkpoint in ``folder``, its weights and moments loaded; (0, []) when none."""
    step, history = checkpoint_history(folder)
    if not step:
        return 0, []
    tensors = load_file(folder / "checkpoint.safetensors")
    drafter.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    for name, parameter in drafter.named_parameters():
        if f"exp_avg.{name}" in tensors:
            optimizer.state[parameter] = {"step": torch.tensor(float(step)), "exp_avg": tensors[f"exp_avg.{name}"], "exp_avg_sq": tensors[f"exp_avg_sq.{name}"]}
    return step, history


def _short_history(batch: int, share: float, window: int, generator: torch.Generator) -> torch.Tensor | None:
    if share <= 0:
        return None
    draw = torch.rand(batch, generator=generator) < share
    lengths = torch.randint(0, window, (batch,), generator=generator)
    return torch.where(draw, lengths, torch.full_like(lengths, window))


def anchor_token_loss(drafter, data: TrainData, index: torch.Tensor, logits: torch.Tensor, soft: bool):
    """(the training token loss, the hard loss, accuracy `[K]`) of ``logits`` at anchors ``index``."""
    device = logits.device
    _, _, _, labels = data.batch(index, drafter.config.context_window, drafter.config.horizon)
    targets = drafter.draft_positions(labels.to(device), missing=-100)
    laws = None
    if soft:
        positions, probs = data.soft_labels(index, drafter.config.horizon)
        laws = (positions.to(device), probs.to(device))
    hard, soft_loss, accuracy = token_losses(logits.log_softmax(-1), targets, laws)
    return (soft_loss if soft else hard), hard, accuracy


def train(drafter, data: TrainData, settings: TrainSettings, target=None, trees: ScoredTrees | None = None, heldout: TrainData | None = None,
          checkpoint: Path | None = None) -> Iterator[dict]:
    """Train ``drafter`` in place; yields one record per step (``step``, ``steps``, ``loss``,
    ``loss_tok``, ``loss_tree``, ``lr``, ``seconds``, ``running_loss``, ``top1_by_depth``; on-policy
    also ``tau_bound``, the step's trees' mean ``1 + C``; every ``eval_every`` steps with
    ``heldout``, ``heldout_loss``). Resumes from ``checkpoint`` and saves there every
    ``save_every`` steps and at the end. With held-out data the drafter ends with the weights of
    its best held-out loss (a drafter can memorise its data)."""
    on = settings.trees == "on-policy"
    if on and target is None:
        raise ValueError("on-policy trees need the target")
    if not on and settings.tree_term != "none" and not trees:
        raise ValueError(f"tree term {settings.tree_term!r} needs scored trees")
    optimizer = optimizer_for(drafter, settings)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    step, history = load_checkpoint(checkpoint, drafter, optimizer) if checkpoint is not None else (0, [])
    best_loss, best_state = float("inf"), None
    if checkpoint is not None and (checkpoint / "best.safetensors").is_file():
        best_state = load_file(checkpoint / "best.safetensors")
        best_loss = min(h["heldout_loss"] for h in history if "heldout_loss" in h)
    schedule = schedule_for(optimizer, settings.warmup, settings.steps, step)
    soft = settings.soft_top > 0
    running = next((h["running_loss"] for h in reversed(history) if "running_loss" in h), None)
    try:
        for step in range(step, settings.steps):
            drafter.train()
            start = time.perf_counter()
            lr = schedule.get_last_lr()[0]
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
            tau_bound = None
            if on:
                index = data.draw(settings.sequences_per_step, settings.anchors_per_sequence, generator)
                part, index, logits, scored = on_policy(target, drafter, data, index, settings.budget, settings.temperature, settings.soft_top,
                                                        settings.soft_top if settings.tree_term == "next-depth" else 0)
                loss_tok, _, accuracy = anchor_token_loss(drafter, part, index, logits, soft)
                loss_tree = tree_loss(logits, scored, list(range(index.shape[0])), settings.tree_term, drafter) if settings.tree_term != "none" else torch.zeros(())
                tau_bound = scored.tau_bound
            else:
                anchors = data.anchors
                index = anchors[torch.randint(0, anchors.shape[0], (settings.batch,), generator=generator)]
                short = _short_history(settings.batch, settings.short_history_share, drafter.config.context_window, generator)
                logits = draft_logits(drafter, data, index, short)
                loss_tok, _, accuracy = anchor_token_loss(drafter, data, index, logits, soft)
                loss_tree = torch.zeros(())
                if settings.tree_term != "none":
                    picks = torch.randint(0, len(trees), (min(settings.tree_batch, len(trees)),), generator=generator)
                    tree_logits = draft_logits(drafter, data, trees.anchors[picks])
                    loss_tree = tree_loss(tree_logits, trees.scored, picks.tolist(), settings.tree_term, drafter)
            loss = loss_tok + settings.lambda_tree * loss_tree if settings.tree_term != "none" else loss_tok
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
            done = step + 1
            running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
            record = {"step": done, "steps": settings.steps, "loss": loss.item(), "loss_tok": loss_tok.item(), "loss_tree": float(loss_tree.detach()),
                      "lr": lr, "seconds": time.perf_counter() - start, "running_loss": running, "top1_by_depth": [round(a, 4) for a in accuracy.tolist()]}
            if tau_bound is not None:
                record["tau_bound"] = tau_bound
            if heldout is not None and settings.eval_every and (done % settings.eval_every == 0 or done == settings.steps):
                measured = heldout_loss(drafter, heldout, soft=soft)
                record.update(heldout_loss=measured["loss"], heldout_token_loss=measured["token_loss"], heldout_top1_by_depth=measured["top1_by_depth"])
                if measured["loss"] < best_loss:
                    best_loss = measured["loss"]
                    best_state = {k: v.detach().clone().contiguous() for k, v in drafter.state_dict().items()}
                    if checkpoint is not None:
                        checkpoint.mkdir(parents=True, exist_ok=True)
                        save_file(best_state, checkpoint / "best.safetensors")
            history.append(record)
            if checkpoint is not None and ((settings.save_every and done % settings.save_every == 0) or done == settings.steps):
                save_checkpoint(checkpoint, drafter, optimizer, done, history, settings)
            yield record
    finally:
        if best_state is not None:
            drafter.load_state_dict(best_state)
        drafter.eval()


def with_progress(records: Iterator[dict], desc: str = "block drafter", progress: bool = True) -> Iterator[dict]:
    """:func:`train`'s records, passed on, shown on a progress bar (``1 + C`` too when on-policy)."""
    bar = tqdm(desc=desc, unit="step", disable=not progress)
    for record in records:
        bar.total = record["steps"]
        bar.set_postfix({"loss": f"{record['running_loss']:.3f}", **({"1+C": f"{record['tau_bound']:.3f}"} if "tau_bound" in record else {})})
        bar.update(record["step"] - bar.n)  # a resumed run starts at its checkpoint's step
        yield record
    bar.close()


@torch.no_grad()
def heldout_loss(drafter, data: TrainData, batch: int = 256, soft: bool = False) -> dict:
    """Mean training loss (``soft`` as in training), mean hard ``L_tok``, top-1 accuracy by depth
    and the top-1 chain's reach by depth over every anchor of held-out data (with features)."""
    was_training = drafter.training
    drafter.eval()
    losses, hard_losses, accuracies, sizes = [], [], [], []
    chain_hits, labelled = 0, 0
    anchors = data.anchors
    for start in range(0, anchors.shape[0], batch):
        index = anchors[start : start + batch]
        logits = draft_logits(drafter, data, index)
        loss, hard, accuracy = anchor_token_loss(drafter, data, index, logits, soft)
        losses.append(loss.item())
        hard_losses.append(hard.item())
        accuracies.append(accuracy)
        sizes.append(index.shape[0])
        targets = drafter.draft_positions(data.batch(index, drafter.config.context_window, drafter.config.horizon)[3].to(logits.device), missing=IGNORE)
        chain_hits = chain_hits + ((logits.argmax(-1) == targets).long().cumprod(-1) * (targets != IGNORE)).sum(0)
        labelled = labelled + (targets != IGNORE).sum(0)
    drafter.train(was_training)
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    return {
        "loss": float(sum(w * l for w, l in zip(weights.tolist(), losses))),
        "token_loss": float(sum(w * l for w, l in zip(weights.tolist(), hard_losses))),
        "top1_by_depth": [round(a, 4) for a in (torch.stack(accuracies) * weights[:, None]).sum(0).tolist()],
        # the top-1 chain's reach: depths 1 .. d all equal the written tokens (the path drafter reads them)
        "chain_reach_by_depth": [round(a, 4) for a in (chain_hits / labelled.clamp(min=1)).tolist()],
        "anchors": int(anchors.shape[0]),
    }
