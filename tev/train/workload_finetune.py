"""A workload's answers as drafter training data: the target's features and next-token laws on
them, and the base drafter's trees on them scored by the target; the settings of the fine-tune
(the loop itself is :func:`tev.train.distill.train_block_drafter`, with a tree term).

``p`` is the frozen target, ``q`` the drafter. Per step:

    L = L_tok + lambda * L_tree

``L_tok`` is the cross-entropy of ``q_1 .. q_K`` against the target's next-token laws along its
answers (its top tokens over the draft vocabulary, as the base drafter learned them), at every
answer position. ``L_tree`` (:func:`tev.train.distill.tree_term`) reads the trees the base
drafter builds at some of those anchors, scored by the target once (fixed):

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

import torch
from tqdm import tqdm
from transformers import DynamicCache

from tev.core.tree import DraftTree
from tev.engine.block_drafter import BlockDrafter
from tev.train.distill import TREE_TERMS, DistillData, DistillSettings, ScoredTrees, target_features
from tev.train.exit_loss import TreeBatch, score_trees
from tev.train.workload_data import WorkloadAnswers

SOFT_TOP = 16  # the target's top tokens kept as soft labels (train-drafter's default)

__all__ = ["TREE_TERMS", "workload_settings", "build_train_set"]


def workload_settings(tree_term: str = "exit", lambda_tree: float = 0.1, steps: int = 160, seed: int = 0) -> DistillSettings:
    """The workload fine-tune: 64 soft-labelled anchors and 16 trees a step, lr 5e-4 (10 warm-up
    steps, cosine to a tenth), no weight decay or short histories (a few minutes from a trained base)."""
    return DistillSettings(steps=steps, batch=64, lr=5e-4, warmup=10, seed=seed, short_history_share=0.0, soft_labels=True,
                           tree_term=tree_term, lambda_tree=lambda_tree, tree_batch=16, weight_decay=0.0)


@torch.no_grad()
def build_train_set(target, drafter: BlockDrafter, answers: WorkloadAnswers, budget: int = 16, soft_top: int = SOFT_TOP, trees_per_answer: int = 8,
                    seed: int = 0, progress: bool = True, compute=contextlib.nullcontext()) -> tuple[DistillData, ScoredTrees]:
    """The target's features and laws on the answers; at ``trees_per_answer`` anchors of each
    answer (seeded), the tree of ``budget`` nodes ``drafter`` builds there (the tree inference
    builds on that text), scored by the target at T = 1 in one tree-attention forward per answer.

    Scoring every anchor's tree costs a forward of ``anchors x budget`` nodes per answer (about
    9 s for a 90-token answer on a 2-core CPU); a few trees per answer keep it near one second.
    ``compute`` (a lock) is held for the feature forward and for each answer's scoring, so a
    server's other users take turns with it."""
    if not len(answers):
        raise ValueError("no answers to train on")
    device = next(target.parameters()).device
    lengths = torch.tensor([len(s) for s in answers.sequences])
    ids = torch.zeros(len(answers), int(lengths.max()), dtype=torch.long)
    for row, sequence in enumerate(answers.sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    vocab = drafter.draft_vocab
    with compute:
        features, soft = target_features(target, ids, lengths, list(drafter.config.feature_layers), progress=progress, soft_vocab=vocab, soft_top=soft_top)
    data = DistillData.build(ids, lengths, torch.tensor(answers.prompt_lengths), features, soft)
    config = drafter.config
    was_training = drafter.training
    drafter.eval()
    parts, chosen = [], []
    generator = torch.Generator().manual_seed(seed)
    for row in tqdm(range(len(answers)), desc="score trees", unit="answer", disable=not progress):
        with compute:
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
    return data, ScoredTrees(TreeBatch.join(parts), torch.cat(chosen))
