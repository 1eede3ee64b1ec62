"""ExitTrain: exit-guided fine-tuning of the block drafter (paper Eq. 14-15).

``p`` is the frozen target, ``q_theta`` the drafter. For each training anchor the drafter's
current (detached) marginals build the DDTree tree inference would build; the frozen target
scores that realized tree with tree attention, giving ``P``, ``rho`` and the exit law ``w``
(all detached). The loss is ``L = L_tok + lambda * L_exit`` with

    L_exit = - sum_i sum_{v != r} w_i(v) log q_{theta, d(v)}(x_v | c_i) / sum_i (|V_i| - 1)

and ``L_tok`` the cross-entropy of the draft marginals against the target's own continuation.
Weight modes: ``exit`` (``w(v)``, the method), ``prefix`` (``P(v)`` rescaled per tree to the
same total as ``w``, the ablation control), ``none`` (token-only fine-tune).

Per step, one causal target forward over a batch of target-regenerated sequences fills a
KV cache and gives the drafter's input features; then ONE more forward appends every
anchor's tree (``anchors_per_sequence`` trees per sequence) with a tree-attention mask.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator

import torch

from tev.util.paths import REPO_ROOT
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from tev.train.distill import IGNORE
from tev.engine.drafters import BlockDrafter
from tev.core.flow import flow_from_edge_prob
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows

__all__ = [
    "ExitTrainConfig",
    "WEIGHT_MODES",
    "exit_loss_terms",
    "node_weights",
    "TreeBatch",
    "score_trees",
    "ExitTrainer",
    "ProgressEvent",
]

WEIGHT_MODES = ("exit", "prefix", "none")


@dataclass(frozen=True)
class ExitTrainConfig:
    """ExitTrain settings (all on the command line)."""

    weights: str = "exit"
    steps: int = 400
    budget: int = 32  # B of the training trees
    lambda_exit: float = 16.0
    temperature: float = 1.0  # target temperature for P, rho, w
    lr: float = 2e-4
    warmup: int = 20
    sequences_per_step: int = 4
    anchors_per_sequence: int = 8
    eval_every: int = 50
    save_every: int = 100
    seed: int = 0

    def __post_init__(self):
        problems = []
        if self.weights not in WEIGHT_MODES:
            problems.append(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {self.weights!r}")
        for name in ("steps", "budget", "sequences_per_step", "anchors_per_sequence"):
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


# --------------------------------------------------------------------------- the loss
def node_weights(exit_weight: torch.Tensor, reach: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-node weights of ``L_exit`` for one tree (root entry 0).

    Args:
        exit_weight, reach: `Tensor[N]`, ``w`` and ``P`` of the tree.
        mode: ``exit`` -> ``w(v)``; ``prefix`` -> ``P(v)`` scaled so that its non-root total
            equals the non-root total of ``w``; ``none`` -> zeros.
    """
    if mode == "exit":
        weights = exit_weight.clone()
    elif mode == "prefix":
        total_exit = exit_weight[1:].sum()
        total_reach = reach[1:].sum()
        weights = reach * (total_exit / total_reach) if total_reach > 0 else torch.zeros_like(reach)
    elif mode == "none":
        weights = torch.zeros_like(exit_weight)
    else:
        raise ValueError(f"unknown weight mode {mode!r}; choose one of {', '.join(WEIGHT_MODES)}")
    weights[0] = 0.0
    return weights.detach()


def exit_loss_terms(
    draft_logits: torch.Tensor,
    example: torch.Tensor,
    depth: torch.Tensor,
    token: torch.Tensor,
    weight: torch.Tensor,
    total_nodes: int,
) -> torch.Tensor:
    """``L_exit`` from draft logits and the flattened non-root nodes of every tree.

    Uses ``log q_d(x) = logits_d[x] - logsumexp(logits_d)``: one log-normaliser per
    (example, depth) row and a gather of the node entries, never an (nodes x V) tensor.

    Args:
        draft_logits: `Tensor[M, K, V]`, the drafter's per-depth logits (with gradient).
        example, depth, token: `LongTensor[n]`, each node's example index, depth (1..K), token.
        weight: `Tensor[n]`, the node weights (detached).
        total_nodes: ``sum_i (|V_i| - 1)``.
    """
    if total_nodes <= 0:
        return draft_logits.sum() * 0.0
    log_norm = torch.logsumexp(draft_logits, dim=-1)  # [M, K]
    log_q = draft_logits[example, depth - 1, token] - log_norm[example, depth - 1]  # [n]
    return -(weight * log_q).sum() / total_nodes


def token_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``L_tok``: mean cross-entropy of ``q_1..q_K`` (`[M, K, V]`) against labels (`[M, K]`)."""
    return F.cross_entropy(draft_logits.reshape(-1, draft_logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


# --------------------------------------------------------------------------- target scoring
@dataclass
class TreeBatch:
    """The realized trees of one step and their target quantities (all detached)."""

    trees: list[DraftTree]
    reach: list[torch.Tensor]
    exit_weight: list[torch.Tensor]
    coverage: list[float]


def _tree_section_mask(trees: list[DraftTree], roots: list[int], cached: int, dtype, device) -> torch.Tensor:
    """`[1, 1, n, cached + n]` additive mask for all trees' non-root nodes appended after a
    ``cached``-long sequence: tree ``a``'s nodes see the sequence up to its root position
    ``roots[a]`` and their own ancestors."""
    sizes = [t.num_nodes - 1 for t in trees]
    n = sum(sizes)
    visible = torch.zeros(n, cached + n, dtype=torch.bool)
    offset = 0
    for tree, root, size in zip(trees, roots, sizes):
        if size == 0:
            continue
        rows = slice(offset, offset + size)
        visible[rows, : root + 1] = True
        ancestors = tree._ancestor_mask[1:, 1:]  # non-root part, [size, size]
        visible[rows, cached + offset : cached + offset + size] = ancestors
        offset += size
    mask = torch.zeros(n, cached + n, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask.to(device)[None, None]


@torch.no_grad()
def score_trees(target, sequence: torch.Tensor, cache: DynamicCache, root_logits: torch.Tensor, trees: list[DraftTree], roots: list[int], temperature: float) -> TreeBatch:
    """Target rows for every node of the trees of ONE sequence, in one tree-attention forward.

    Args:
        sequence: `LongTensor[S]` whose causal forward filled ``cache`` (batch row 0).
        root_logits: `Tensor[A, V]`, target logits at each root position (row ``a`` is
            ``p_root`` of ``trees[a]``, from the causal forward).
        roots: root positions in ``sequence`` (tree ``a``'s root token is ``sequence[roots[a]]``).
    """
    device = root_logits.device
    cached = sequence.numel()
    tokens = torch.cat([t.tokens[1:] for t in trees]) if trees else torch.zeros(0, dtype=torch.long)
    node_logits = None
    if tokens.numel():
        positions = torch.cat([root + t.depths[1:] for t, root in zip(trees, roots)])
        mask = _tree_section_mask(trees, roots, cached, next(target.parameters()).dtype, device)
        out = target(input_ids=tokens[None].to(device), position_ids=positions[None].to(device), attention_mask=mask, cache=cache, use_cache=True)
        node_logits = out.logits[0].float()
        cache.crop(-tokens.numel())  # leave the sequence cache as it was
    reach, exit_weight, coverage = [], [], []
    offset = 0
    for a, tree in enumerate(trees):
        size = tree.num_nodes - 1
        logits = root_logits[a : a + 1] if size == 0 else torch.cat([root_logits[a : a + 1], node_logits[offset : offset + size]])
        offset += size
        rows = TargetRows(logits=logits, temperature=temperature)
        flow = flow_from_edge_prob(tree, rows.edge_prob(tree))
        reach.append(flow.reach.detach())
        exit_weight.append(flow.exit_weight.detach())
        coverage.append(flow.coverage)
    return TreeBatch(trees, reach, exit_weight, coverage)


# --------------------------------------------------------------------------- trainer
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


class ExitTrainer:
    """Fine-tunes a :class:`BlockDrafter` with ExitTrain on token sequences.

    Args:
        target: the frozen target (its parameters are never updated).
        drafter: the block drafter to train (in place).
        sequences: `LongTensor[S, T]` training sequences (context + target continuation).
        heldout: optional `LongTensor[S', T]` for the periodic held-out ``1 + C``.
        first_anchor: the first anchor position (the last context position).
        accelerator: an ``accelerate.Accelerator`` (one CPU process when None).
    """

    def __init__(self, config: ExitTrainConfig, target, drafter: BlockDrafter, sequences: torch.Tensor, heldout: torch.Tensor | None = None, first_anchor: int = 0, accelerator=None):
        from accelerate import Accelerator

        self.config = config
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.target = target.to(self.accelerator.device).eval()
        for parameter in self.target.parameters():
            parameter.requires_grad_(False)
        if sequences.dim() != 2 or sequences.shape[1] < first_anchor + 3:
            raise ValueError("training sequences must be [S, T] with room for anchors after the context")
        if sequences.shape[0] < 1:
            raise ValueError("no training sequences")
        self.sequences = sequences
        self.heldout = heldout
        self.first_anchor = first_anchor
        self.horizon = drafter.config.horizon
        self.window = drafter.config.context_window
        self.feature_layers = list(drafter.config.feature_layers)
        self.raw_drafter = drafter
        optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
        self.drafter, self.optimizer = self.accelerator.prepare(drafter, optimizer)
        rank = self.accelerator.process_index
        self.generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
        self.step = 0
        self.history: list[dict] = []
        self._cancel = threading.Event()

    # ------------------------------------------------------------------ control
    def cancel(self) -> None:
        """Stop after the current step (safe to call from another thread)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def learning_rate(self, step: int) -> float:
        config = self.config
        if step < config.warmup:
            return config.lr * (step + 1) / max(1, config.warmup)
        progress = (step - config.warmup) / max(1, config.steps - config.warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    # ------------------------------------------------------------------ one batch
    def _sample(self, sequences: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence rows `[s]`, anchor positions `[s, A]`), anchors sorted and distinct."""
        config = self.config
        count = min(config.sequences_per_step, sequences.shape[0])
        rows = torch.randperm(sequences.shape[0], generator=generator)[:count]
        last = sequences.shape[1] - 2  # an anchor needs a root after it
        span = last - self.first_anchor + 1
        per = min(config.anchors_per_sequence, span)
        anchors = torch.stack([torch.randperm(span, generator=generator)[:per] for _ in range(count)]) + self.first_anchor
        return rows, anchors.sort(dim=1).values

    def _features_window(self, features: torch.Tensor, anchors: torch.Tensor):
        """features `[s, T, F]`, anchors `[s, A]` -> windows `[s*A, W, F]`, valid `[s*A, W]`."""
        offsets = torch.arange(-self.window + 1, 1, device=features.device)
        positions = anchors[..., None].to(features.device) + offsets  # [s, A, W]
        valid = positions >= 0
        rows = torch.arange(features.shape[0], device=features.device)[:, None, None]
        windows = features[rows, positions.clamp(min=0)] * valid[..., None]
        return windows.flatten(0, 1), valid.flatten(0, 1)

    def _forward_batch(self, sequences: torch.Tensor, rows: torch.Tensor, anchors: torch.Tensor, train: bool):
        """Drafter logits, the realized trees' target quantities and the token labels."""
        device = self.accelerator.device
        batch = sequences[rows].to(device)  # [s, T]
        cache = DynamicCache(config=self.target.config)
        with torch.no_grad():
            out = self.target(input_ids=batch, cache=cache, use_cache=True, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1).float()  # [s, T, F]
            target_logits = out.logits.float()  # [s, T, V]
        windows, valid = self._features_window(features, anchors)
        anchor_flat = anchors.to(device)
        root_ids = batch.gather(1, anchor_flat + 1).flatten()  # [s*A]
        with torch.set_grad_enabled(train):
            draft_logits = self.drafter(windows, valid, root_ids)  # [s*A, K, V]
        # realized trees from the current drafter (detached), one target forward per sequence
        logq = torch.log_softmax(draft_logits.detach().float(), dim=-1).cpu()
        trees, reach, exit_weight, coverage = [], [], [], []
        per = anchors.shape[1]
        for i in range(batch.shape[0]):
            seq_trees, roots = [], []
            for a in range(per):
                m = i * per + a
                root_position = int(anchors[i, a]) + 1
                room = self.target.config.max_position_embeddings - 1 - root_position
                depth = max(0, min(self.horizon, room))
                seq_trees.append(DraftTree.from_marginals(logq[m, :depth], self.config.budget, root_token=int(root_ids[m])))
                roots.append(root_position)
            row_cache = _select_row(cache, i)
            scored = score_trees(self.target, batch[i], row_cache, target_logits[i, [r for r in roots]], seq_trees, roots, self.config.temperature)
            trees += scored.trees
            reach += scored.reach
            exit_weight += scored.exit_weight
            coverage += scored.coverage
        label_positions = anchor_flat.unsqueeze(-1) + 2 + torch.arange(self.horizon, device=device)  # [s, A, K]
        in_range = label_positions < batch.shape[1]
        labels = batch.unsqueeze(1).expand(-1, per, -1).gather(2, label_positions.clamp(max=batch.shape[1] - 1))
        labels = torch.where(in_range, labels, torch.full_like(labels, IGNORE)).flatten(0, 1)  # [s*A, K]
        return draft_logits, trees, reach, exit_weight, coverage, labels

    def _loss(self, draft_logits, trees, reach, exit_weight, labels):
        device = draft_logits.device
        loss_tok = token_loss(draft_logits, labels)
        examples, depths, tokens, weights = [], [], [], []
        for m, tree in enumerate(trees):
            if tree.num_nodes == 1:
                continue
            examples.append(torch.full((tree.num_nodes - 1,), m, dtype=torch.long))
            depths.append(tree.depths[1:])
            tokens.append(tree.tokens[1:])
            weights.append(node_weights(exit_weight[m], reach[m], self.config.weights)[1:].cpu())
        total_nodes = sum(t.num_nodes - 1 for t in trees)
        if examples and self.config.weights != "none":
            loss_exit = exit_loss_terms(
                draft_logits, torch.cat(examples).to(device), torch.cat(depths).to(device), torch.cat(tokens).to(device),
                torch.cat(weights).to(device=device, dtype=draft_logits.dtype), total_nodes,
            )
        else:
            loss_exit = draft_logits.sum() * 0.0
        return loss_tok + self.config.lambda_exit * loss_exit, loss_tok, loss_exit

    def train_step(self) -> ProgressEvent:
        start = time.perf_counter()
        self.drafter.train()
        lr = self.learning_rate(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rows, anchors = self._sample(self.sequences, self.generator)
        draft_logits, trees, reach, exit_weight, coverage, labels = self._forward_batch(self.sequences, rows, anchors, train=True)
        loss, loss_tok, loss_exit = self._loss(draft_logits, trees, reach, exit_weight, labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.drafter.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        event = ProgressEvent(
            step=self.step, steps=self.config.steps, loss=loss.item(), loss_tok=loss_tok.item(), loss_exit=loss_exit.item(),
            expected_tau=1.0 + sum(coverage) / len(coverage), seconds=time.perf_counter() - start, lr=lr,
        )
        return event

    @torch.no_grad()
    def heldout_expected_tau(self, batches: int = 4, seed: int = 12345) -> float:
        """Mean ``1 + C(T)`` of the current drafter's trees on held-out sequences (fixed anchors)."""
        if self.heldout is None:
            return float("nan")
        self.drafter.eval()
        generator = torch.Generator().manual_seed(seed)
        values = []
        for _ in range(batches):
            rows, anchors = self._sample(self.heldout, generator)
            _, _, _, _, coverage, _ = self._forward_batch(self.heldout, rows, anchors, train=False)
            values += coverage
        return 1.0 + sum(values) / len(values)

    def run(self, checkpoint_dir: Path | None = None) -> Iterator[ProgressEvent]:
        """Train until ``config.steps`` or :meth:`cancel`; yields one event per step."""
        config = self.config
        while self.step < config.steps and not self.cancelled:
            event = self.train_step()
            if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.steps):
                event.heldout_expected_tau = self.heldout_expected_tau()
            self.history.append(asdict(event))
            if checkpoint_dir is not None and config.save_every and (self.step % config.save_every == 0 or self.step == config.steps):
                self.save_checkpoint(checkpoint_dir)
            yield event

    # ------------------------------------------------------------------ checkpoints (safetensors only)
    def save_checkpoint(self, folder: Path) -> None:
        """Write ``folder/checkpoint`` atomically: a complete new folder, then renames."""
        if not self.accelerator.is_main_process:
            return
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _recover_checkpoint(folder)
        for leftover in folder.glob(".checkpoint.tmp-*"):  # a killed writer's partial folder
            shutil.rmtree(leftover, ignore_errors=True)
        staged = folder / f".checkpoint.tmp-{os.getpid()}"
        try:
            staged.mkdir()
            self._write_checkpoint(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)  # never leave a partial checkpoint behind
            raise
        final = folder / "checkpoint"
        retired = folder / f".checkpoint.old-{os.getpid()}"
        if final.exists():
            os.replace(final, retired)
        os.replace(staged, final)
        shutil.rmtree(retired, ignore_errors=True)

    def _write_checkpoint(self, staged: Path) -> None:
        drafter = self.accelerator.unwrap_model(self.drafter)
        drafter.save_pretrained(staged)
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
        save_file(state, staged / "trainer_state.safetensors")
        (staged / "trainer_state.json").write_text(json.dumps({"step": self.step, "config": asdict(self.config), "history": self.history}, indent=1))

    def load_checkpoint(self, folder: Path) -> bool:
        """Resume from ``folder/checkpoint`` if it exists; returns whether it did."""
        _recover_checkpoint(Path(folder))
        final = Path(folder) / "checkpoint"
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
        self.history = meta.get("history", [])
        return True


def _recover_checkpoint(folder: Path) -> None:
    """A writer killed between its two renames leaves only ``.checkpoint.old-*``: restore it."""
    final = folder / "checkpoint"
    for retired in sorted(folder.glob(".checkpoint.old-*")):
        if final.exists():
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(retired, final)


def _select_row(cache: DynamicCache, row: int) -> DynamicCache:
    """A new cache holding batch row ``row`` of ``cache`` (so trees can be appended to it)."""
    single = DynamicCache(config=None)
    for index, layer in enumerate(cache.layers):
        single.update(layer.keys[row : row + 1], layer.values[row : row + 1], index)
    return single


def config_from_args(args) -> ExitTrainConfig:
    values = {f.name: getattr(args, f.name) for f in fields(ExitTrainConfig) if hasattr(args, f.name)}
    return ExitTrainConfig(**values)


# --------------------------------------------------------------------------- data and command line
def training_sequences(target, tokenizer, split: str, count: int, context_length: int, new_tokens: int, seed: int, cache_dir: Path | None = None, progress: bool = True) -> torch.Tensor:
    """Target-regenerated sequences from a corpus split, cached by their settings."""
    from tev.train.build import BuildConfig, encode_corpus
    from tev.train.distill import regenerate_sequences

    key = f"{split}-{count}-{context_length}-{new_tokens}-{seed}-{_fingerprint(target)}"
    if cache_dir is not None:
        path = Path(cache_dir) / f"sequences-{key}.safetensors"
        if path.is_file():
            return load_file(path)["sequences"].long()
    stream, _ = encode_corpus(tokenizer, split, BuildConfig())
    sequences = regenerate_sequences(target, stream, count, context_length, new_tokens, seed, progress=progress, desc=f"{split} sequences")
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".tmp-{os.getpid()}")
        save_file({"sequences": sequences.to(torch.int32)}, temporary)
        os.replace(temporary, path)
    return sequences


def _fingerprint(model) -> str:
    """A short content hash of a model's weights (to key caches)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items())[:6]:
        digest.update(name.encode())
        digest.update(tensor.detach().float().flatten()[:4096].cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def install_drafter(drafter: BlockDrafter, destination: Path, extra_files: dict[str, str] | None = None) -> None:
    """Save ``drafter`` (and ``extra_files``) into a staging folder, then swap it in for ``destination``."""
    destination = Path(destination)
    staged = destination.with_name(f".{destination.name}.new-{os.getpid()}")
    retired = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    drafter.save_pretrained(staged)
    for name, text in (extra_files or {}).items():
        (staged / name).write_text(text)
    if destination.exists():
        os.replace(destination, retired)
    os.replace(staged, destination)
    shutil.rmtree(retired, ignore_errors=True)


def _invoked_command() -> str:
    """This process's ``python -m tev ...`` command line, shell-quoted (for reports and the card)."""
    return shlex.join(["python", "-m", "tev", *sys.argv[1:]])


def exittrain_command(args) -> None:
    from tqdm import tqdm

    from tev.engine.models import load_bundle
    from tev.util.paths import embedded

    for flag in ("data_sequences", "heldout_sequences", "context_length", "new_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.eval_prompts < 0:
        raise ValueError(f"--eval-prompts must be 0 (skip) or more, got {args.eval_prompts}")
    config = config_from_args(args)
    root = REPO_ROOT
    out = Path(args.out) if args.out else root / "runs" / "exittrain" / f"{config.weights}-{time.strftime('%Y%m%d-%H%M%S')}"
    assets = (root / "assets").resolve()
    if out.resolve() == assets or assets in out.resolve().parents:
        raise ValueError(f"--out {out} is inside assets/; write elsewhere and use --install to ship a result")
    if args.resume and not (out / "checkpoint").is_dir():
        raise FileNotFoundError(f"--resume: no checkpoint in {out}")
    bundle = load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download)
    base = Path(args.base) if args.base else embedded("block")
    drafter = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
    cache_dir = root / "runs" / "exittrain-data"
    train = training_sequences(bundle.target, bundle.tokenizer, "train", args.data_sequences, args.context_length, args.new_tokens, seed=config.seed + 7, cache_dir=cache_dir)
    heldout = training_sequences(bundle.target, bundle.tokenizer, "heldout", args.heldout_sequences, args.context_length, args.new_tokens, seed=config.seed + 8, cache_dir=cache_dir)
    trainer = ExitTrainer(config, bundle.target, drafter, train, heldout=heldout, first_anchor=args.context_length - 1)
    if args.resume and trainer.load_checkpoint(out):
        print(f"resumed from {out / 'checkpoint'} at step {trainer.step}")
    before = trainer.heldout_expected_tau() if trainer.step == 0 else None
    start = time.time()
    bar = tqdm(total=config.steps, initial=trainer.step, desc=f"exittrain[{config.weights}]", unit="step")
    for event in trainer.run(out):
        postfix = {"loss": f"{event.loss:.3f}", "1+C": f"{event.expected_tau:.3f}"}
        if event.heldout_expected_tau is not None:
            postfix["heldout 1+C"] = f"{event.heldout_expected_tau:.3f}"
        bar.set_postfix(postfix)
        bar.update(1)
    bar.close()
    seconds = time.time() - start
    trained = trainer.accelerator.unwrap_model(trainer.drafter)
    trained.config.notes = {**trained.config.notes, "exittrain": asdict(config), "trained_by": "python -m tev exittrain"}
    trained.save_pretrained(out / "drafter")
    after = trainer.heldout_expected_tau()
    report = {"config": asdict(config), "steps_done": trainer.step, "seconds": seconds, "heldout_expected_tau_before": before, "heldout_expected_tau_after": after, "history": trainer.history}
    if args.eval_prompts:
        from tev.bench.benchmarks import evaluate_drafter, format_tau_table
        from tev.engine.drafters import BlockTreeDrafter
        from tev.data.prompts import load_prompt_set

        prompts = load_prompt_set("heldout")[:: max(1, 64 // args.eval_prompts)][: args.eval_prompts]
        original = BlockDrafter.from_pretrained(base, bundle.target)
        rows = {}
        for name, model in (("before", original), ("after", trained.eval().to(torch.bfloat16))):
            rows[name] = evaluate_drafter(bundle.target, bundle.tokenizer, BlockTreeDrafter(model, name=name), prompts, budgets=(32,), temperatures=(0.0, 1.0), desc=f"tau {name}")
            print(f"{name}:\n" + format_tau_table(rows[name]))
        report["tau"] = rows
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"held-out expected 1 + C: before {before if before is not None else float('nan'):.3f}, after {after:.3f}; {seconds / 60:.1f} min; saved {out / 'drafter'}")
    if args.install:
        if trainer.step < config.steps:
            raise ValueError("the run did not finish; not installing a partial drafter")
        from tev.train.build import refresh_card
        from tev.util.paths import assets_dir

        report["command"] = _invoked_command()
        install_drafter(trained, embedded("exittrain"), extra_files={"exittrain.json": json.dumps(report, indent=1)})
        refresh_card(assets_dir())
        print(f"installed as {embedded('exittrain')}; model card updated")


# --------------------------------------------------------------------------- live mode (the app)
# Calibrated on this 2-core CPU: 300 steps take about 70 s; lr 1e-3 (60 steps) lowered tau by 16%.
LIVE_CONFIG = ExitTrainConfig(steps=300, budget=32, lambda_exit=16.0, lr=2e-4, warmup=5, sequences_per_step=2, anchors_per_sequence=8, eval_every=20, save_every=0)


def load_live_data(path: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train sequences, held-out sequences, first anchor) shipped for the live mode."""
    from tev.util.paths import models_dir

    path = Path(path or models_dir() / "exittrain-data.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"the live ExitTrain data is missing ({path}); rebuild it with `python -m tev build-assets`")
    tensors = load_file(path)
    return tensors["train"].long(), tensors["heldout"].long(), int(tensors["first_anchor"].item())


# --------------------------------------------------------------------------- evaluation: the ablation
def run_ablation(
    bundle,
    base: Path,
    modes=("none", "prefix", "exit"),
    config: ExitTrainConfig = ExitTrainConfig(),
    data_sequences: int = 1024,
    context_length: int = 128,
    new_tokens: int = 96,
    prompts: list[dict] | None = None,
    budgets=(16, 32, 64),
    temperatures=(0.0, 1.0),
    max_new_tokens: int = 64,
    out: Path | None = None,
    progress: bool = True,
    cache_dir: Path | None = REPO_ROOT / "runs" / "exittrain-data",
) -> dict:
    """Train one drafter per weight mode from the same base, data, seed and steps; then
    measure decoding ``tau`` (TEV) and mean ``1 + C`` for the base and every variant.

    The training sequences are cached in ``cache_dir`` (None: no cache); with ``out`` each
    trained drafter is saved as ``out/drafter-<mode>``.
    """
    from tqdm import tqdm

    from tev.bench.benchmarks import evaluate_drafter
    from tev.engine.drafters import BlockTreeDrafter

    train = training_sequences(bundle.target, bundle.tokenizer, "train", data_sequences, context_length, new_tokens, seed=config.seed + 7, cache_dir=cache_dir, progress=progress)
    heldout = training_sequences(bundle.target, bundle.tokenizer, "heldout", 48, context_length, new_tokens, seed=config.seed + 8, cache_dir=cache_dir, progress=progress)
    drafters = {"base": BlockDrafter.from_pretrained(base, bundle.target)}
    training = {}
    base_heldout_tau = None
    for mode in modes:
        variant = ExitTrainConfig(**{**asdict(config), "weights": mode, "save_every": 0})
        drafter = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
        trainer = ExitTrainer(variant, bundle.target, drafter, train, heldout=heldout, first_anchor=context_length - 1)
        if base_heldout_tau is None:  # same held-out anchors and temperature for every mode
            base_heldout_tau = trainer.heldout_expected_tau()
        start = time.time()
        bar = tqdm(total=variant.steps, desc=f"train [{mode}]", disable=not progress)
        for event in trainer.run():
            bar.set_postfix(loss=f"{event.loss:.3f}", tau_bound=f"{event.expected_tau:.3f}")
            bar.update(1)
        bar.close()
        trained = trainer.accelerator.unwrap_model(trainer.drafter).eval()
        training[mode] = {"seconds": time.time() - start, "heldout_expected_tau": trainer.heldout_expected_tau(), "history": trainer.history}
        if out is not None:
            trained.save_pretrained(Path(out) / f"drafter-{mode}")
        drafters[mode] = trained.to(torch.bfloat16)
    rows = []
    for name, model in drafters.items():
        measured = evaluate_drafter(bundle.target, bundle.tokenizer, BlockTreeDrafter(model, name=name), prompts, budgets=budgets, temperatures=temperatures, max_new_tokens=max_new_tokens, desc=f"tau [{name}]", progress=progress)
        rows += [{"drafter": name, **row} for row in measured]
    return {"config": asdict(config), "data_sequences": data_sequences, "prompts": len(prompts), "rows": rows, "training": training, "base_heldout_expected_tau": base_heldout_tau}


def format_ablation(result: dict) -> str:
    rows = result["rows"]
    base = {(r["budget"], r["temperature"]): r["tau"] for r in rows if r["drafter"] == "base"}
    lines = ["| T | B | drafter | tau (+- s.e.) | vs base | mean 1 + C |", "|---|---|---|---|---|---|"]
    order = ("base", "none", "prefix", "exit")  # the controls first, the method last
    for r in sorted(rows, key=lambda r: (r["temperature"], r["budget"], order.index(r["drafter"]) if r["drafter"] in order else len(order))):
        change = r["tau"] / base[(r["budget"], r["temperature"])] - 1
        lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['drafter']} | {r['tau']:.3f} +- {r['tau_se']:.3f} | {100 * change:+.1f}% | {r['tau_bound']:.3f} |")
    return "\n".join(lines)


def ablation_command(args) -> None:
    from tev.engine.models import load_bundle
    from tev.util.paths import embedded
    from tev.data.prompts import load_prompt_set

    root = REPO_ROOT
    out = Path(args.out) if args.out else root / "runs" / f"exittrain-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download)
    config = ExitTrainConfig(**{**asdict(ExitTrainConfig()), "steps": args.steps, "budget": args.budget, "lambda_exit": args.lambda_exit, "lr": args.lr, "seed": args.seed, "eval_every": 0, "save_every": 0})
    prompts = load_prompt_set("heldout")[:: max(1, 64 // args.num_prompts)][: args.num_prompts]
    if args.live:
        result = run_live_check(bundle, args.live_seeds, prompts, max_new_tokens=args.max_new_tokens)
        (out / "exittrain-live.json").write_text(json.dumps(result, indent=1))
        for key, change in result["tau_change"].items():
            print(f"live mode ({result['config']['steps']} steps, {sum(r['train_seconds'] for r in result['runs']) / len(result['runs']):.0f}s of training): {key}: "
                  f"tau {change['base_tau']:.3f} -> change mean {100 * change['mean']:+.1f}% (min {100 * change['min']:+.1f}%, max {100 * change['max']:+.1f}%) over seeds {args.live_seeds}")
        print(f"wrote {out / 'exittrain-live.json'}")
        return
    if args.install and "exit" not in args.modes:
        raise ValueError("--install ships the exit-weighted drafter: keep exit in --modes")
    result = run_ablation(bundle, Path(args.base) if args.base else embedded("block"), args.modes, config, args.data_sequences, prompts=prompts, budgets=args.budgets, temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, out=out)
    result["command"] = _invoked_command()
    (out / "exittrain-eval.json").write_text(json.dumps(result, indent=1))
    print(format_ablation(result))
    print(f"wrote {out / 'exittrain-eval.json'}")
    if args.install:
        install_from_ablation(result, out, bundle.target)


def install_from_ablation(result: dict, out: Path, target) -> None:
    """Ship the ablation's exit-weighted drafter, so the shipped drafter is the one the
    evaluation measured; its card entry has the same fields ``exittrain --install`` writes."""
    from tev.train.build import refresh_card
    from tev.util.paths import assets_dir, embedded

    config = {**result["config"], "weights": "exit"}
    training = result["training"]["exit"]
    entry = {
        "config": config,
        "steps_done": config["steps"],
        "seconds": training["seconds"],
        "heldout_expected_tau_before": result["base_heldout_expected_tau"],
        "heldout_expected_tau_after": training["heldout_expected_tau"],
        "history": training["history"],
        "tau": {name: [row for row in result["rows"] if row["drafter"] == drafter] for name, drafter in (("before", "base"), ("after", "exit"))},
        "ablation": format_ablation(result),
        "command": result["command"],
    }
    trained = BlockDrafter.from_pretrained(out / "drafter-exit", target)
    trained.config.notes = {**trained.config.notes, "exittrain": config, "trained_by": result["command"]}
    install_drafter(trained, embedded("exittrain"), extra_files={"exittrain.json": json.dumps(entry, indent=1)})
    refresh_card(assets_dir())
    print(f"installed the exit-weighted drafter as {embedded('exittrain')}; model card updated")


def run_live_check(bundle, seeds=(0, 1, 2), prompts: list[dict] | None = None, budget: int = 32, max_new_tokens: int = 64, progress: bool = True) -> dict:
    """The app's live mode (``LIVE_CONFIG`` on the shipped live data) from the base drafter,
    once per seed: wall time and the decoding ``tau`` change on held-out prompts."""
    from tev.bench.benchmarks import evaluate_drafter
    from tev.engine.drafters import BlockTreeDrafter
    from tev.util.paths import embedded

    train, heldout, first_anchor = load_live_data()
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(embedded("block"), bundle.target), name="base")
    reference = evaluate_drafter(bundle.target, bundle.tokenizer, base, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc="tau [base]", progress=progress)
    runs = []
    for seed in seeds:
        config = ExitTrainConfig(**{**asdict(LIVE_CONFIG), "seed": seed})
        trainer = ExitTrainer(config, bundle.target, BlockDrafter.from_pretrained(embedded("block"), bundle.target, dtype=torch.float32), train, heldout=heldout, first_anchor=first_anchor)
        start = time.time()
        for _ in trainer.run():
            pass
        seconds = time.time() - start
        trained = BlockTreeDrafter(trainer.accelerator.unwrap_model(trainer.drafter).eval().to(torch.bfloat16), name=f"live-{seed}")
        rows = evaluate_drafter(bundle.target, bundle.tokenizer, trained, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc=f"tau [live seed {seed}]", progress=progress)
        runs.append({"seed": seed, "train_seconds": seconds, "rows": rows})
    changes = {}
    for i, base_row in enumerate(reference):
        values = [run["rows"][i]["tau"] / base_row["tau"] - 1 for run in runs]
        changes[f"T={base_row['temperature']:g}"] = {"base_tau": base_row["tau"], "relative_changes": values, "mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    return {"config": asdict(LIVE_CONFIG), "budget": budget, "prompts": len(prompts), "base": reference, "runs": runs, "tau_change": changes}
