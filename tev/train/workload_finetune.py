"""Fine-tuning a block drafter on a workload's answers: the token loss on the target's own text,
plus an optional tree term on the trees inference built while answering.

``p`` is the frozen target, ``q`` the drafter. Per step:

    L = L_tok + lambda * L_tree

``L_tok`` is the cross-entropy of ``q_1 .. q_K`` against the target's next-token laws along its
answers (its top tokens over the draft vocabulary, as the base drafter learned them), at every
answer position. ``L_tree`` reads the trees the base drafter builds at those anchors, scored by
the target once (their target quantities are fixed):

- ``reach`` / ``exit`` / ``exit-depth``: ``sum_v weight(v) * -log q_{d(v)}(x_v) / (nodes)``, the
  official code's tree term with its weights (floored ``P(v)``, ``w(v)``, ``w(v) d(v)``);
- ``next-depth``: at every node ``v`` above the horizon the target's law ``p_v`` is the label of
  depth ``d(v) + 1``, weighted by the reach ``P(v)``, the root included: distillation of the
  target's marginals on the tree the drafter actually builds, which reaches tokens the tree
  missed (the other weights can only raise tokens it already holds);
- ``none``: the token-only control.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache, get_cosine_with_min_lr_schedule_with_warmup

from tqdm import tqdm

from tev.core.tree import DraftTree
from tev.engine.drafters import BlockDrafter
from tev.train.distill import DistillData, drafter_losses, target_features
from tev.train.exit_loss import IGNORE, TreeBatch, exit_loss_terms, node_weights, score_trees
from tev.train.workload_data import WorkloadAnswers

__all__ = ["TREE_TERMS", "WorkloadTrainSet", "FinetuneSettings", "build_train_set", "finetune_drafter", "tree_term"]

TREE_TERMS = ("none", "reach", "exit", "exit-depth", "next-depth")


@dataclass
class WorkloadTrainSet:
    """Everything the fine-tune reads, computed once from the answers.

    Attributes:
        data: the answers with the target's features and next-token laws (every answer
            position is an anchor of ``L_tok``).
        scored: the base drafter's trees at some anchors of each answer, with ``P``, ``w``, edge
            probabilities and every node's next-token law (at T = 1, over the draft vocabulary).
        tree_anchors: `LongTensor[R, 2]` (answer, anchor position) of each tree.
    """

    data: DistillData
    scored: TreeBatch
    tree_anchors: torch.Tensor


@dataclass(frozen=True)
class FinetuneSettings:
    """A workload fine-tune's settings (one seed fixes its batches)."""

    tree_term: str = "none"
    lambda_tree: float = 0.1
    steps: int = 160
    batch: int = 64  # anchors of L_tok per step
    tree_batch: int = 16  # trees of L_tree per step
    lr: float = 5e-4
    warmup: int = 10
    seed: int = 0
    soft_top: int = 16

    def __post_init__(self):
        if self.tree_term not in TREE_TERMS:
            raise ValueError(f"tree term must be one of {', '.join(TREE_TERMS)}, got {self.tree_term!r}")
        for name in ("steps", "batch", "tree_batch", "soft_top"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not math.isfinite(self.lr) or self.lr <= 0 or not math.isfinite(self.lambda_tree) or self.lambda_tree < 0:
            raise ValueError("lr must be > 0 and lambda_tree >= 0 (finite)")


@torch.no_grad()
def build_train_set(target, drafter: BlockDrafter, answers: WorkloadAnswers, budget: int = 16, soft_top: int = 16, trees_per_answer: int = 8,
                    seed: int = 0, progress: bool = True) -> WorkloadTrainSet:
    """The target's features and laws on the answers; at ``trees_per_answer`` anchors of each
    answer (seeded), the tree of ``budget`` nodes ``drafter`` builds there (the tree inference
    builds on that text), scored by the target at T = 1 in one tree-attention forward per answer.

    Scoring every anchor's tree costs a forward of ``anchors x budget`` nodes per answer (about
    9 s for a 90-token answer on a 2-core CPU); a few trees per answer keep it near one second."""
    if not len(answers):
        raise ValueError("no answers to train on")
    device = next(target.parameters()).device
    lengths = torch.tensor([len(s) for s in answers.sequences])
    ids = torch.zeros(len(answers), int(lengths.max()), dtype=torch.long)
    for row, sequence in enumerate(answers.sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    vocab = drafter.draft_vocab
    features, soft = target_features(target, ids, lengths, list(drafter.config.feature_layers), progress=progress, soft_vocab=vocab, soft_top=soft_top)
    data = DistillData.build(ids, lengths, torch.tensor(answers.prompt_lengths), features, soft)
    config = drafter.config
    was_training = drafter.training
    drafter.eval()
    parts, chosen = [], []
    generator = torch.Generator().manual_seed(seed)
    for row in tqdm(range(len(answers)), desc="score trees", unit="answer", disable=not progress):
        index = data.anchors[data.anchors[:, 0] == row]  # [A, 2]
        keep = torch.randperm(index.shape[0], generator=generator)[:trees_per_answer].sort().values
        index = index[keep]
        chosen.append(index)
        window, valid, root, _ = data.batch(index, config.context_window, config.horizon)
        log_q = drafter.full_vocab(drafter.draft_logits(window.to(device), valid.to(device), root.to(device)).float().log_softmax(-1)).cpu()  # [A, K, V]
        roots = (index[:, 1] + 1).tolist()
        trees = [DraftTree.from_marginals(log_q[a], budget, root_token=int(root[a])) for a in range(len(roots))]
        tokens = ids[row, : int(lengths[row])].to(device)
        cache = DynamicCache(config=target.config)
        logits = target(input_ids=tokens[None], cache=cache, use_cache=True).logits[0].float()  # [S, V]
        parts.append(score_trees(target, tokens, cache, logits[roots], trees, roots, 1.0, soft_vocab=vocab, soft_top=soft_top))
    drafter.train(was_training)
    return WorkloadTrainSet(data, TreeBatch.join(parts), torch.cat(chosen))


def tree_term(drafter: BlockDrafter, train_set: WorkloadTrainSet, picks: torch.Tensor, mode: str) -> torch.Tensor:
    """``L_tree`` of the trees ``picks`` (`LongTensor[R]` into ``train_set.scored``)."""
    config = drafter.config
    device = drafter.mask_embed.device
    features, valid, root, _ = train_set.data.batch(train_set.tree_anchors[picks], config.context_window, config.horizon)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = drafter.draft_logits(features.to(device), valid.to(device), root.to(device)).float()  # [R, K, Vd]
    scored = train_set.scored
    trees = [scored.trees[i] for i in picks.tolist()]
    if mode == "next-depth":
        log_q = logits.log_softmax(-1)
        total, weight_sum = logits.sum() * 0.0, 0.0
        for m, i in enumerate(picks.tolist()):
            tree = trees[m]
            inner = tree.depths < config.horizon  # nodes whose next token is a depth the drafter predicts
            depth = tree.depths[inner]
            positions, probs = (x[inner] for x in scored.node_soft[i])
            weight = scored.reach[i].cpu()[inner].float()
            rows = log_q[m, depth]  # [n, Vd]: q_{d(v) + 1}
            cross = -(probs.to(device) * rows.gather(-1, positions.to(device))).sum(-1)  # [n]
            total = total + (weight.to(device) * cross).sum()
            weight_sum += float(weight.sum())
        return total / max(weight_sum, 1e-9)
    examples, depths, tokens, weights = [], [], [], []
    for m, i in enumerate(picks.tolist()):
        tree = trees[m]
        if tree.num_nodes == 1:
            continue
        token = drafter.draft_positions(tree.tokens[1:].to(device))
        keep = token != IGNORE  # a token outside the draft vocabulary has no q to raise
        weight = node_weights(scored.exit_weight[i].cpu(), scored.reach[i].cpu(), mode, tree, scored.edge_prob[i])[1:].to(device)
        examples.append(torch.full((int(keep.sum()),), m, dtype=torch.long, device=device))
        depths.append(tree.depths[1:].to(device)[keep])
        tokens.append(token[keep])
        weights.append(weight[keep])
    total_nodes = sum(t.num_nodes - 1 for t in trees)
    if not examples:
        return logits.sum() * 0.0
    return exit_loss_terms(logits, torch.cat(examples), torch.cat(depths), torch.cat(tokens), torch.cat(weights).float(), total_nodes)


def finetune_drafter(
    drafter: BlockDrafter,
    train_set: WorkloadTrainSet,
    settings: FinetuneSettings,
    deadline: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[dict], None] | None = None,
    compute=contextlib.nullcontext(),
) -> list[dict]:
    """Fine-tune ``drafter`` in place (its float32 weights) for ``settings.steps`` steps, or
    until ``deadline`` (``time.monotonic()``) or ``should_stop()``; returns one record per step
    (``step``, ``loss``, ``loss_tok``, ``loss_tree``, ``seconds``). ``compute`` (a lock) is held
    for each step."""
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0, betas=(0.9, 0.95))
    schedule = get_cosine_with_min_lr_schedule_with_warmup(optimizer, settings.warmup, settings.steps, min_lr_rate=0.1)
    data = train_set.data
    trees = len(train_set.scored.trees)
    history = []
    drafter.train()
    start = time.perf_counter()
    for step in range(settings.steps):
        if (should_stop is not None and should_stop()) or (deadline is not None and time.monotonic() > deadline):
            break
        with compute:
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
            pick = torch.randint(0, data.num_anchors, (settings.batch,), generator=generator)
            _, loss_tok, _ = drafter_losses(drafter, data, data.anchors[pick], soft=True)
            loss = loss_tok
            loss_tree = torch.zeros(())
            if settings.tree_term != "none" and trees:
                tree_pick = torch.randint(0, trees, (min(settings.tree_batch, trees),), generator=generator)
                loss_tree = tree_term(drafter, train_set, tree_pick, settings.tree_term)
                loss = loss + settings.lambda_tree * loss_tree
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
        record = {"step": step + 1, "loss": loss.item(), "loss_tok": loss_tok.item(), "loss_tree": float(loss_tree.detach()), "seconds": time.perf_counter() - start}
        history.append(record)
        if on_step is not None:
            on_step(record)
    drafter.eval()
    return history
