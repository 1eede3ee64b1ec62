"""Self-distillation of the block drafter: data and training.

The drafter ``q`` learns the target's own behaviour: text the target ``p`` wrote itself (corpus
continuations for the tiny pair, answers to its own requests for a chat target), with the
target's hidden features at every position from one teacher-forced forward. Every position of
the target's text is an anchor: features up to ``t``, root ``x_{t+1}``, labels
``x_{t+2} .. x_{t+1+K}``. The loss is ``L_tok``, cross-entropy of the per-depth marginals; a
drafter with a draft vocabulary is trained over it only (labels outside are ignored).

Soft labels (optional): instead of the one token the target wrote at ``t+1+k``, the label is
the target's own distribution of that token given the text before it, ``p(. | x_{<=t+k})``
(its top few tokens over the draft vocabulary, from the same teacher-forced forward). Averaged
over what the target writes, that conditional IS the marginal ``q_k`` should learn, so the
minimiser is the same and each anchor carries far more than one sample of it: what a drafter
short of data needs.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import DynamicCache, get_cosine_with_min_lr_schedule_with_warmup

from tev.core.sampling import probs_from_logits, sample_rows
from tev.engine.block_drafter import BlockDrafter
from tev.train.exit_loss import IGNORE, TreeBatch, next_depth_loss, tree_node_loss
from tev.util.files import atomic_folder

__all__ = [
    "DistillData",
    "DistillSettings",
    "SoftLabels",
    "sample_continuations",
    "regenerate_sequences",
    "target_features",
    "make_distill_data",
    "drafter_loss",
    "drafter_losses",
    "train_block_drafter",
    "heldout_loss",
    "ScoredTrees",
    "tree_term",
    "TREE_TERMS",
]

TREE_TERMS = ("none", "reach", "exit", "exit-depth", "next-depth")


@torch.no_grad()
def sample_continuations(target, contexts: torch.Tensor, new_tokens: int, temperature: float, generator: torch.Generator, batch: int = 32) -> torch.Tensor:
    """Continue each context with the target.

    Args:
        contexts: `LongTensor[S, Lc]`.
        temperature: 0 for greedy, else sampling at that temperature.

    Returns:
        `LongTensor[S, Lc + new_tokens]`.
    """
    device = next(target.parameters()).device
    outputs = []
    for start in range(0, contexts.shape[0], batch):
        ids = contexts[start : start + batch].to(device)
        cache = DynamicCache(config=target.config)
        logits = target(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
        pieces = [ids]
        for _ in range(new_tokens):
            if temperature == 0:
                token = logits.argmax(dim=-1)
            else:
                token = sample_rows(probs_from_logits(logits, temperature), generator)
            pieces.append(token[:, None])
            logits = target(input_ids=token[:, None], cache=cache, use_cache=True).logits[:, -1]
        outputs.append(torch.cat(pieces, dim=1).cpu())
    return torch.cat(outputs)


def regenerate_sequences(
    target,
    stream: torch.Tensor,
    num_sequences: int,
    context_length: int,
    new_tokens: int,
    seed: int,
    greedy_share: float = 0.5,
    progress: bool = True,
    desc: str = "target continuations",
) -> torch.Tensor:
    """Target-regenerated sequences: contexts at random offsets of ``stream``, continued by the
    target; a ``greedy_share`` of them greedily (what T = 0 decoding meets), the rest sampled at
    T = 1. Returns `LongTensor[num_sequences, context_length + new_tokens]`."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - context_length, (num_sequences,), generator=generator)
    contexts = torch.stack([stream[s : s + context_length] for s in starts.tolist()])
    greedy_count = int(round(num_sequences * greedy_share))
    parts = []
    chunk = 64
    bar = tqdm(total=num_sequences, desc=desc, unit="seq", disable=not progress)
    for start in range(0, num_sequences, chunk):
        block = contexts[start : start + chunk]
        temperature = 0.0 if start < greedy_count else 1.0
        parts.append(sample_continuations(target, block, new_tokens, temperature, generator))
        bar.update(block.shape[0])
    bar.close()
    return torch.cat(parts)


@torch.no_grad()
def target_features(
    target, token_ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], batch: int = 8, progress: bool = True,
    soft_vocab: torch.Tensor | None = None, soft_top: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, "SoftLabels"]:
    """`Tensor[S, T, F]` (bfloat16): hidden states at ``layers``, concatenated, of each
    right-padded sequence.

    With ``soft_top > 0`` also the target's next-token distributions as :class:`SoftLabels`:
    at every position, the ``soft_top`` most likely tokens of the target's distribution over
    ``soft_vocab`` (the drafter's draft vocabulary; renormalised over it, T = 1).
    """
    device = next(target.parameters()).device
    body = target.get_decoder() if hasattr(target, "get_decoder") else target.base_model
    out = torch.zeros(*token_ids.shape, len(layers) * target.config.hidden_size, dtype=torch.bfloat16)
    soft, head_rows = None, None
    if soft_top > 0:
        head = target.get_output_embeddings().weight
        head_rows = head if soft_vocab is None else head[soft_vocab.to(head.device)]  # [Vd, H]
        soft_top = min(soft_top, head_rows.shape[0])  # a draft vocabulary smaller than k keeps all of it
        soft = SoftLabels(torch.zeros(*token_ids.shape, soft_top, dtype=torch.int16 if head_rows.shape[0] < 2**15 else torch.int32),
                          torch.zeros(*token_ids.shape, soft_top, dtype=torch.float16))
    order = torch.argsort(lengths, descending=True)  # similar lengths share a batch: less padding
    for start in tqdm(range(0, len(order), batch), desc="target features", unit="batch", disable=not progress):
        rows = order[start : start + batch]
        width = int(lengths[rows].max())
        ids = token_ids[rows, :width].to(device)
        mask = (torch.arange(width)[None] < lengths[rows, None]).long().to(device)
        result = body(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = result.hidden_states
        out[rows, :width] = torch.cat([hidden[i] for i in layers], dim=-1).to(torch.bfloat16).cpu()
        if soft is not None:
            # the final (normed) hidden state through the draft-vocabulary rows of the head
            probs = torch.softmax((result.last_hidden_state @ head_rows.T).float(), dim=-1)
            top = probs.topk(soft_top, dim=-1)
            soft.positions[rows, :width] = top.indices.to(soft.positions.dtype).cpu()
            soft.probs[rows, :width] = top.values.to(torch.float16).cpu()
    return out if soft is None else (out, soft)


@dataclass
class SoftLabels:
    """The target's next-token distribution at every position, truncated to its top tokens.

    Attributes:
        positions: `Tensor[S, T, k]` (int16 or int32), indices into the draft vocabulary.
        probs: `Tensor[S, T, k]` (float16), their probabilities (renormalised when used).
    """

    positions: torch.Tensor
    probs: torch.Tensor


def make_distill_data(target, stream: torch.Tensor, layers: list[int], num_sequences: int, context_length: int, new_tokens: int, seed: int, greedy_share: float = 0.5, progress: bool = True) -> DistillData:
    """Target-regenerated corpus continuations (see :func:`regenerate_sequences`) with their
    features; the anchors are the continuation's positions."""
    sequences = regenerate_sequences(target, stream, num_sequences, context_length, new_tokens, seed, greedy_share, progress)
    lengths = torch.full((sequences.shape[0],), sequences.shape[1])
    starts = torch.full((sequences.shape[0],), context_length)
    return DistillData.build(sequences, lengths, starts, target_features(target, sequences, lengths, layers, progress=progress))


@dataclass(frozen=True)
class DistillSettings:
    """How a block drafter is trained on :class:`DistillData` (``L_tok`` only)."""

    steps: int
    batch: int
    lr: float
    warmup: int = 100
    seed: int = 0
    short_history_share: float = 0.1  # anchors that see only a few features (a prompt's first rounds)
    save_every: int = 0  # checkpoint interval in steps (0: only at the end, when a folder is given)
    eval_every: int = 0  # held-out loss interval in steps, when held-out data is given (0: never)
    soft_labels: bool = False  # learn the target's distributions (DistillData.soft), not its written tokens
    tree_term: str = "none"  # with ScoredTrees: none, reach, exit, exit-depth or next-depth (see tree_term)
    lambda_tree: float = 0.1  # weight of the tree term against the token loss
    tree_batch: int = 16  # scored trees per step
    weight_decay: float = 0.01

    def __post_init__(self):
        if self.tree_term not in TREE_TERMS:
            raise ValueError(f"tree term must be one of {', '.join(TREE_TERMS)}, got {self.tree_term!r}")
        for name in ("steps", "batch", "tree_batch"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not math.isfinite(self.lr) or self.lr <= 0 or not math.isfinite(self.lambda_tree) or self.lambda_tree < 0:
            raise ValueError("lr must be > 0 and lambda_tree >= 0 (finite numbers)")


@dataclass
class DistillData:
    """Target-written sequences with the target's features, ready for anchor batches.

    Attributes:
        token_ids: `LongTensor[S, T]`, right-padded.
        lengths: `LongTensor[S]`, real length of each sequence.
        prompt_lengths: `LongTensor[S]`, where the target's own text starts (a continuation or an answer).
        features: `Tensor[S, T, F]` (bfloat16), target hidden states at the feature layers.
        anchors: `LongTensor[A, 2]` of (conversation, position t): every position whose root
            ``x_{t+1}`` is the last prompt token or a response token before the last.
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    features: torch.Tensor
    anchors: torch.Tensor
    soft: SoftLabels | None = None

    @classmethod
    def build(cls, token_ids, lengths, prompt_lengths, features, soft: SoftLabels | None = None) -> "DistillData":
        pieces = []
        for row, (length, start) in enumerate(zip(lengths.tolist(), prompt_lengths.tolist())):
            positions = torch.arange(max(0, start - 2), length - 2)  # labels x_{t+2} start at the response
            pieces.append(torch.stack([torch.full_like(positions, row), positions], dim=1))
        return cls(token_ids, lengths, prompt_lengths, features, torch.cat(pieces), soft)

    @property
    def num_anchors(self) -> int:
        return int(self.anchors.shape[0])

    def batch(self, index: torch.Tensor, window: int, horizon: int, short_history: torch.Tensor | None = None):
        """Features `[B, W, F]`, valid `[B, W]`, root ids `[B]`, labels `[B, K]` (IGNORE past the end)."""
        row, anchor = index[:, 0], index[:, 1]
        offsets = torch.arange(-window + 1, 1)
        positions = anchor[:, None] + offsets[None]  # [B, W]
        valid = positions >= 0
        if short_history is not None:
            valid &= offsets[None] > -short_history[:, None]
        features = self.features[row[:, None], positions.clamp(min=0)] * valid[..., None]
        root = self.token_ids[row, anchor + 1]
        label_positions = anchor[:, None] + 2 + torch.arange(horizon)[None]  # [B, K]
        labels = self.token_ids[row[:, None], label_positions.clamp(max=self.token_ids.shape[1] - 1)]
        labels = torch.where(label_positions < self.lengths[row, None], labels, torch.full_like(labels, IGNORE))
        return features, valid, root, labels

    def soft_labels(self, index: torch.Tensor, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's distributions of the labelled tokens of anchors ``index``: draft-vocabulary
        positions `LongTensor[B, K, k]` and probabilities `Tensor[B, K, k]` summing to 1 (the
        distribution of ``x_{t+2+d}`` is the one the target gave at position ``t+1+d``)."""
        row, anchor = index[:, 0], index[:, 1]
        at = (anchor[:, None] + 1 + torch.arange(horizon)[None]).clamp(max=self.token_ids.shape[1] - 1)
        positions = self.soft.positions[row[:, None], at].long()
        probs = self.soft.probs[row[:, None], at].float()
        return positions, probs / probs.sum(-1, keepdim=True).clamp(min=1e-6)


def _short_history(batch: int, share: float, window: int, generator: torch.Generator) -> torch.Tensor | None:
    if share <= 0:
        return None
    draw = torch.rand(batch, generator=generator) < share
    lengths = torch.randint(0, window, (batch,), generator=generator)
    return torch.where(draw, lengths, torch.full_like(lengths, window))


def drafter_losses(drafter: BlockDrafter, data: DistillData, index: torch.Tensor, short_history=None, soft: bool = False):
    """One drafter forward on the anchors ``index`` (`[B, 2]`): mean ``L_tok`` against the
    written tokens over the labelled depths, the mean cross-entropy against the target's
    distributions (``data.soft``; None unless ``soft``), and the per-depth top-1 accuracy `[K]`
    against the written tokens (labels outside the draft vocabulary count as misses)."""
    config = drafter.config
    device = drafter.mask_embed.device
    features, valid, root, labels = data.batch(index, config.context_window, config.horizon, short_history)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = drafter.draft_logits(features.to(device), valid.to(device), root.to(device)).float()  # [B, K, Vd]
    log_q = logits.log_softmax(-1)
    targets = drafter.draft_positions(labels.to(device), missing=IGNORE)
    labelled = labels.to(device) != IGNORE
    token_loss = F.nll_loss(log_q.reshape(-1, log_q.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)
    soft_loss = None
    if soft:
        positions, probs = data.soft_labels(index, config.horizon)
        per_label = -(probs.to(device) * log_q.gather(-1, positions.to(device))).sum(-1)  # [B, K]
        soft_loss = (per_label * labelled).sum() / labelled.sum().clamp(min=1)
    hits = (logits.argmax(-1) == targets) & labelled
    accuracy = hits.sum(0).float() / labelled.sum(0).clamp(min=1)
    return token_loss, soft_loss, accuracy.detach()


def drafter_loss(drafter: BlockDrafter, data: DistillData, index: torch.Tensor, short_history=None, soft: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss on the anchors ``index``: ``L_tok`` against the written tokens, or with
    ``soft`` against the target's distributions; and the per-depth top-1 accuracy `[K]`."""
    token_loss, soft_loss, accuracy = drafter_losses(drafter, data, index, short_history, soft)
    return (soft_loss if soft else token_loss), accuracy


@dataclass
class ScoredTrees:
    """Draft trees at anchors of a :class:`DistillData`, scored once by the target (fixed).

    Attributes:
        scored: the trees with ``P``, ``w``, edge probabilities and every node's next-token law
            over the draft vocabulary (``node_soft``).
        anchors: `LongTensor[R, 2]` (sequence, anchor position) of each tree, in the data's
            convention (anchor ``t``: features up to ``t``, root ``x_{t+1}``).
    """

    scored: TreeBatch
    anchors: torch.Tensor

    def __len__(self) -> int:
        return len(self.scored.trees)


def tree_term(drafter: BlockDrafter, data: DistillData, trees: ScoredTrees, picks: torch.Tensor, mode: str) -> torch.Tensor:
    """``L_tree`` of the trees ``picks`` (`LongTensor[R]` into ``trees``): the drafter's logits at
    their anchors, then :func:`tev.train.exit_loss.tree_node_loss` (``reach`` / ``exit`` /
    ``exit-depth``, the official code's form) or :func:`tev.train.exit_loss.next_depth_loss`."""
    config = drafter.config
    device = drafter.mask_embed.device
    features, valid, root, _ = data.batch(trees.anchors[picks], config.context_window, config.horizon)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = drafter.draft_logits(features.to(device), valid.to(device), root.to(device)).float()  # [R, K, Vd]
    if mode == "next-depth":
        return next_depth_loss(logits, trees.scored, picks.tolist(), config.horizon)
    return tree_node_loss(logits, trees.scored, picks.tolist(), mode, drafter.draft_positions)


def _save_checkpoint(folder: Path, drafter: BlockDrafter, optimizer: torch.optim.Optimizer, step: int, history: list[dict]) -> None:
    """Drafter weights and AdamW moments as safetensors, the step and history as JSON (atomic)."""
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
        (staging / "checkpoint.json").write_text(json.dumps({"step": step, "history": history}))


def _load_checkpoint(folder: Path, drafter: BlockDrafter, optimizer: torch.optim.Optimizer) -> tuple[int, list[dict]]:
    meta = json.loads((folder / "checkpoint.json").read_text())
    tensors = load_file(folder / "checkpoint.safetensors")
    drafter.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    step = meta["step"]
    for name, parameter in drafter.named_parameters():
        if f"exp_avg.{name}" in tensors:
            optimizer.state[parameter] = {
                "step": torch.tensor(float(step)),
                "exp_avg": tensors[f"exp_avg.{name}"],
                "exp_avg_sq": tensors[f"exp_avg_sq.{name}"],
            }
    return step, meta["history"]


def train_block_drafter(
    drafter: BlockDrafter,
    data: DistillData,
    settings: DistillSettings,
    checkpoint: Path | None = None,
    heldout: DistillData | None = None,
    progress: bool = True,
    trees: ScoredTrees | None = None,
    deadline: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[dict], None] | None = None,
    compute=contextlib.nullcontext(),
) -> list[dict]:
    """The one drafter loop: ``L_tok`` on every anchor of ``data`` (distillation), plus
    ``settings.lambda_tree`` times the tree term on ``trees`` when ``settings.tree_term`` is
    not ``none`` (ExitTrain on scored trees); resumes from ``checkpoint``.

    The anchors of step ``s`` come from a generator seeded with ``(seed, s)``, so a resumed run
    draws the same batches as an uninterrupted one. With ``heldout`` data the held-out loss is
    measured every ``eval_every`` steps and the drafter ends with the weights of the best one
    (early stopping: a drafter can memorise its data). The loop ends early at ``deadline`` (a
    ``time.monotonic()`` value) or when ``should_stop()``; ``on_step(record)`` gets every step's
    ``step``, ``loss``, ``loss_tok``, ``loss_tree``; ``compute`` (a lock) is held for each step.
    Returns the loss history.
    """
    if settings.tree_term != "none" and not trees:
        raise ValueError(f"tree term {settings.tree_term!r} needs scored trees")
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95))
    step, history = 0, []
    if checkpoint is not None and (checkpoint / "checkpoint.json").is_file():
        step, history = _load_checkpoint(checkpoint, drafter, optimizer)
    best_loss, best_state = float("inf"), None
    if checkpoint is not None and (checkpoint / "best.safetensors").is_file():
        best_state = load_file(checkpoint / "best.safetensors")
        best_loss = min(h["heldout_loss"] for h in history if "heldout_loss" in h)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", settings.lr)  # lets the schedule start at a resumed step
    # linear warm-up, then cosine decay to a tenth of the peak; the next step (``step``) uses its lr
    schedule = get_cosine_with_min_lr_schedule_with_warmup(optimizer, settings.warmup, settings.steps, min_lr_rate=0.1, last_epoch=step - 1)
    drafter.train()
    running = next((h["loss"] for h in reversed(history) if "loss" in h), None)
    bar = tqdm(range(step, settings.steps), initial=step, total=settings.steps, desc="block drafter", unit="step", disable=not progress)
    for step in bar:
        if (should_stop is not None and should_stop()) or (deadline is not None and time.monotonic() > deadline):
            break
        with compute:
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
            pick = torch.randint(0, data.anchors.shape[0], (settings.batch,), generator=generator)
            short = _short_history(settings.batch, settings.short_history_share, drafter.config.context_window, generator)
            loss_tok, accuracy = drafter_loss(drafter, data, data.anchors[pick], short, soft=settings.soft_labels)
            loss, loss_tree = loss_tok, torch.zeros(())
            if settings.tree_term != "none":
                tree_pick = torch.randint(0, len(trees), (min(settings.tree_batch, len(trees)),), generator=generator)
                loss_tree = tree_term(drafter, data, trees, tree_pick, settings.tree_term)
                loss = loss_tok + settings.lambda_tree * loss_tree
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        bar.set_postfix(loss=f"{running:.3f}", acc1=f"{accuracy[0].item():.2f}")
        done = step + 1
        if on_step is not None:
            on_step({"step": done, "loss": loss.item(), "loss_tok": loss_tok.item(), "loss_tree": float(loss_tree.detach())})
        if done % max(1, settings.steps // 40) == 0 or done == settings.steps:
            history.append({"step": done, "loss": running, "top1_by_depth": [round(a, 4) for a in accuracy.tolist()]})
        if heldout is not None and settings.eval_every and (done % settings.eval_every == 0 or done == settings.steps):
            measured = heldout_loss(drafter, heldout, soft=settings.soft_labels)
            history.append({"step": done, "heldout_loss": measured["loss"], "heldout_token_loss": measured["token_loss"], "heldout_top1_by_depth": measured["top1_by_depth"]})
            bar.write(f"step {done}: held-out loss {measured['loss']:.3f}, top-1 by depth {measured['top1_by_depth'][:4]}")
            if measured["loss"] < best_loss:
                best_loss = measured["loss"]
                best_state = {k: v.detach().clone().contiguous() for k, v in drafter.state_dict().items()}
                if checkpoint is not None:
                    checkpoint.mkdir(parents=True, exist_ok=True)
                    save_file(best_state, checkpoint / "best.safetensors")
        if checkpoint is not None and ((settings.save_every and done % settings.save_every == 0) or done == settings.steps):
            _save_checkpoint(checkpoint, drafter, optimizer, done, history)
    if best_state is not None:
        drafter.load_state_dict(best_state)
    drafter.eval()
    return history


@torch.no_grad()
def heldout_loss(drafter: BlockDrafter, data: DistillData, batch: int = 256, soft: bool = False) -> dict:
    """Mean training loss (``soft`` as in training), mean ``L_tok`` against the written tokens
    and top-1 accuracy by depth over every anchor of held-out conversations."""
    was_training = drafter.training
    drafter.eval()
    losses, token_losses, accuracies, sizes = [], [], [], []
    for start in range(0, data.anchors.shape[0], batch):
        index = data.anchors[start : start + batch]
        token_loss, soft_loss, accuracy = drafter_losses(drafter, data, index, soft=soft)
        token_losses.append(token_loss.item())
        losses.append((soft_loss if soft else token_loss).item())
        accuracies.append(accuracy)
        sizes.append(index.shape[0])
    drafter.train(was_training)
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    return {
        "loss": float(sum(w * l for w, l in zip(weights.tolist(), losses))),
        "token_loss": float(sum(w * l for w, l in zip(weights.tolist(), token_losses))),
        "top1_by_depth": [round(a, 4) for a in (torch.stack(accuracies) * weights[:, None]).sum(0).tolist()],
        "anchors": int(data.anchors.shape[0]),
    }
