"""``python -m tev train-drafter``: a block drafter for any Llama/Qwen-architecture chat target.

Stages, each cached in the work folder so a stopped run resumes where it was:

1. requests   the target writes its own user requests (self-instruct, :mod:`tev.train.teacher`)
2. responses  the target answers them (greedy for a share, T = 1 for the rest)
3. features   one teacher-forced target forward per conversation: hidden states at a few layers
4. training   the one-pass block drafter learns ``L_tok`` on every response position (anchor),
              checkpointed every ``save_every`` steps (safetensors), resumable
5. evaluation held-out loss on held-out conversations, ``tau`` on the held-out chat prompts
6. install    the drafter and its ``training.json`` (recipe, data, loss, tau) into ``--out``

The drafter's draft vocabulary is the ``draft_vocab`` most frequent tokens of the training
responses: the target head's 49,152 rows are most of a drafter step's cost, and a token
outside the most frequent few thousand is rarely one a tree would keep.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shlex
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch

from tev.data.prompts import load_prompt_set
from tev.engine.block_drafter import BlockDrafter, BlockDrafterConfig
from tev.engine.default_target import DEFAULT_TARGET_NAME, ensure_default_target
from tev.engine.evaluation import evaluate_drafter
from tev.engine.models import drafter_model_class, load_causal_lm, load_tokenizer, tree_drafter_of
from tev.engine.prompt_text import ChatTemplate
from tev.engine.target import Target
from tev.pipelines.card import refresh_card
from tev.train.data import TrainData
from tev.train.loop import TrainSettings, checkpoint_history, drafter_shape, fit_to_target, heldout_loss, install_drafter, train, with_progress
from tev.train.feature_cache import cached_features
from tev.train.teacher import write_requests, write_responses
from tev.util.files import write_text_atomic
from tev.util.paths import REPO_ROOT, assets_dir
from tev.util.precision import low_precision
from tev.util.stored import result_text

__all__ = ["split_conversations", "cached_conversations", "DrafterRecipe", "QUICK_RECIPE", "draft_vocabulary", "chat_prompt_tau", "train_drafter_pipeline", "train_drafter_command"]



@dataclass(frozen=True)
class DrafterRecipe:
    """Everything that decides the trained drafter; seeded, so a rerun gives the same drafter."""

    seed: int = 0
    # data the target writes, in shards (each seeded on its own, cached and resumable; more
    # shards add data without changing the earlier ones)
    shard_requests: int = 1056
    shards: int = 3
    heldout_requests: int = 32  # conversations of all the shards kept out of training, for the held-out loss
    request_tokens: int = 64
    response_tokens: int = 192
    greedy_share: float = 0.5
    # the data writer: "continuous" (tev/engine/batch_writer.py: generation_batch slots, a new request
    # taking a slot as soon as an answer ends) or "batch" (batch_generate.py, which wrote the first drafters)
    writer: str = "continuous"
    generation_batch: int = 192  # rows written at once: a row of a 192-row product costs about half of one in a 16-row product
    # the drafter's shape; draft_vocab_size: the most frequent response tokens it may propose. Feature
    # dropout: the target's features identify a position almost uniquely, without it the drafter memorises
    drafter: BlockDrafterConfig = field(default_factory=lambda: drafter_shape(
        horizon=8, context_window=16, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=768, draft_vocab_size=8192,
        feature_norm="per_layer", feature_dropout=0.1))
    # labels: the target's top-16 laws over the draft vocabulary; the held-out loss every 100 steps (the
    # best step's weights are kept); its seed is the recipe's
    train: TrainSettings = field(default_factory=lambda: TrainSettings(steps=2400, batch=256, warmup=100, save_every=100, eval_every=100, soft_top=16))
    # evaluation on the held-out chat prompts
    eval_budget: int = 32  # measured with B = 16 as well (the benchmarks' budget)
    eval_new_tokens: int = 64

    def __post_init__(self):
        object.__setattr__(self, "train", replace(self.train, seed=self.seed))

    def eval_budgets(self) -> tuple[int, ...]:
        """The budgets ``tau`` is measured at: ``eval_budget`` and the benchmarks' B = 16."""
        return tuple(sorted({16, self.eval_budget}))

    @classmethod
    def from_json(cls, values: dict) -> "DrafterRecipe":
        """A recipe from JSON; recipes written before it held a :class:`TrainSettings` give its fields at the top."""
        own = {f.name for f in fields(cls)} - {"drafter", "train"}
        train = values.get("train") or {k: v for k, v in values.items() if k not in own | {"drafter"}}
        return cls(**{k: v for k, v in values.items() if k in own}, drafter=BlockDrafterConfig(**values["drafter"]), train=TrainSettings(**train))


STORED_SOFT_TOP = 16  # the target's top tokens kept per position in the feature cache

# what a shard's conversations depend on (the shard count and the held-out share do not change them)
DATA_FIELDS = ("seed", "shard_requests", "request_tokens", "response_tokens", "greedy_share", "writer", "generation_batch")

QUICK_RECIPE = DrafterRecipe(
    shard_requests=8, shards=2, heldout_requests=4, request_tokens=16, response_tokens=16, generation_batch=8,
    drafter=drafter_shape(horizon=4, context_window=4, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, draft_vocab_size=256,
                          feature_norm="per_layer", feature_dropout=0.1),
    train=TrainSettings(steps=12, batch=16, warmup=2, save_every=5, eval_every=4, soft_top=16), eval_new_tokens=8,
)


# --------------------------------------------------------------------------- data
def draft_vocabulary(conversations: TrainData, size: int, always: tuple[int, ...] = ()) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent response tokens (plus ``always``), and their share of all response tokens."""
    counts = Counter()
    for ids, start in zip(conversations.sequences, conversations.prompt_lengths.tolist()):
        counts.update(ids[start:])
    chosen = [token for token in always]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    total = sum(counts.values())
    covered = sum(counts[t] for t in chosen)
    return torch.tensor(sorted(chosen)), covered / max(1, total)


# --------------------------------------------------------------------------- the command
def _shard_folder(work: Path, shard: int) -> Path:
    """Where shard ``shard``'s requests and conversations are cached in the work folder."""
    return work / f"shard-{shard:03d}"


def write_shards(target, tokenizer, work: Path, recipe: DrafterRecipe, exclude: list[str], progress: bool = True) -> TrainData:
    """Every shard's conversations, from the cache in ``work/shard-NNN/`` where present.

    A shard's requests never repeat an earlier shard's or an ``exclude`` text (the held-out
    evaluation prompts); its responses are saved after every ``generation_batch`` answers, so a
    stopped run loses at most that many.
    """
    if recipe.writer != "continuous":
        raise ValueError(f"only the continuous writer writes new shards (the recipe names {recipe.writer!r})")
    parts: list[TrainData] = []
    written: list[str] = []
    for shard in range(recipe.shards):
        folder = _shard_folder(work, shard)
        folder.mkdir(parents=True, exist_ok=True)
        seed = recipe.seed + 7919 * shard  # shard 0 uses the recipe's seed itself
        if progress:
            print(f"shard {shard + 1} of {recipe.shards} ({folder})", flush=True)
        requests = _stage_json(folder / "requests.json", lambda: write_requests(
            target, tokenizer, recipe.shard_requests, seed, recipe.request_tokens, exclude=[*exclude, *written],
            slots=recipe.generation_batch, progress=progress))
        written += [text for _, text in requests]
        partial = folder / "responses.partial.json"

        def write():
            done = {int(k): v for k, v in json.loads(partial.read_text()).items()} if partial.is_file() else None
            save = lambda answers: write_text_atomic(partial, json.dumps(answers))  # noqa: E731
            return write_responses(target, tokenizer, [tuple(r) for r in requests], recipe.response_tokens, seed + 1,
                                   recipe.greedy_share, slots=recipe.generation_batch, progress=progress, done=done, on_answers=save).to_json()

        parts.append(TrainData.from_json(_stage_json(folder / "conversations.json", write)))
        partial.unlink(missing_ok=True)
    return TrainData.concat(parts)


def _feature_parts(work: Path) -> set[tuple[str, int]]:
    """The feature cache's saved parts in ``work`` as (path, modification time): a part written again reads as another."""
    return {(str(path), path.stat().st_mtime_ns) for path in work.glob("features-*/part-*.safetensors")}


def split_conversations(conversations: TrainData, recipe: DrafterRecipe) -> tuple[TrainData, TrainData]:
    """(train, held-out) parts of every shard's conversations; the held-out ones are a seeded
    random subset, so greedy and sampled answers are in both parts."""
    order = torch.randperm(len(conversations), generator=torch.Generator().manual_seed(recipe.seed + 2)).tolist()
    return conversations.select(order).split(recipe.heldout_requests)


def cached_conversations(work: Path) -> tuple[TrainData, DrafterRecipe]:
    """Every shard's conversations a finished ``train-drafter`` run left in ``work``, and its recipe."""
    recipe_path = work / "recipe.json"
    if not recipe_path.is_file():
        raise FileNotFoundError(f"{work} holds no train-drafter run (no recipe.json); run `python -m tev train-drafter --work-dir {work}` first")
    recipe = DrafterRecipe.from_json(json.loads(recipe_path.read_text()))
    parts = []
    for shard in range(recipe.shards):
        path = _shard_folder(work, shard) / "conversations.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the train-drafter run in {work} did not finish its data")
        parts.append(TrainData.from_json(json.loads(path.read_text())))
    return TrainData.concat(parts), recipe


def chat_prompt_tau(target, tokenizer, drafter: BlockDrafter, prompts: list[dict], recipe: DrafterRecipe, progress: bool = True) -> list[dict]:
    """``tau`` of ``drafter`` (run in bfloat16, as shipped) on ``prompts`` at the recipe's budgets,
    T = 0 (greedy) and T = 1 (TEV), its new tokens and seed: rows of :func:`evaluate_drafter`. The target
    (a model) runs transformers' forward: no forward was chosen for it."""
    tree_drafter = tree_drafter_of(drafter.served())
    return evaluate_drafter(Target(target), tokenizer, tree_drafter, prompts, budgets=recipe.eval_budgets(), temperatures=(0.0, 1.0),
                            max_new_tokens=recipe.eval_new_tokens, seed=recipe.seed, progress=progress, desc="tau on held-out chat prompts")


def _stage_json(path: Path, make):
    """Load a cached JSON stage, or make it and write it atomically."""
    if path.is_file():
        return json.loads(path.read_text())
    value = make()
    write_text_atomic(path, json.dumps(value))
    return value


@contextlib.contextmanager
def _stage(timings: dict, key: str):
    """Time the ``with`` block into ``timings[key]`` (seconds)."""
    start = time.time()
    yield
    timings[key] = time.time() - start


def _claim_work(work: Path, recipe: DrafterRecipe) -> None:
    """Mark ``work`` as this recipe's: data of another recipe is refused; the same data with other training
    settings keeps the data and drops the stale checkpoint."""
    work.mkdir(parents=True, exist_ok=True)
    recipe_path = work / "recipe.json"
    if recipe_path.is_file() and json.loads(recipe_path.read_text()) != asdict(recipe):
        cached = json.loads(recipe_path.read_text())
        if any(cached.get(name) != getattr(recipe, name) for name in DATA_FIELDS):
            raise ValueError(f"{work} holds data of another recipe; pass a new --work-dir (or delete it) to start over")
        shutil.rmtree(work / "checkpoint", ignore_errors=True)  # same data, new training: only the checkpoint is stale
    recipe_path.write_text(json.dumps(asdict(recipe), indent=1))


def _frozen_target(target_source: str, allow_download: bool):
    """The target, frozen; the data writer and the feature forward run in bfloat16 only where this CPU is faster at it."""
    target = load_causal_lm(target_source, device="cpu", dtype=low_precision("cpu"), allow_download=allow_download).eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    return target


def _datasets(work: Path, target, parts: dict, end_of_turn: int, feature_layers, vocab, recipe: DrafterRecipe, progress: bool) -> dict:
    """``{"train", "heldout"}``: each part's conversations as training data with the target's features and soft
    labels (cached in ``work``)."""
    datasets = {}
    for name, part in parts.items():
        data = datasets[name] = TrainData.from_lists(part.sequences, part.prompt_lengths.tolist(), end_of_turn)
        data.features, data.soft = cached_features(work / f"features-{name}", target, data.token_ids, data.lengths, feature_layers, vocab,
                                                   max(recipe.train.soft_top, STORED_SOFT_TOP), progress)
        data.soft = data.soft.top(recipe.train.soft_top) if recipe.train.soft_top else None
    return datasets


def _drafter_config(recipe: DrafterRecipe, target, vocab, command: str):
    """The recipe's drafter fitted to the target and the draft vocabulary, its notes naming how it was trained."""
    loss = (f"cross-entropy against the target's top-{recipe.train.soft_top} next-token distributions" if recipe.train.soft_top
            else "token-level cross-entropy") + " on the target's own chat responses"
    return fit_to_target(recipe.drafter, target, draft_vocab_size=int(vocab.numel()), notes={"trained_by": command, "loss": loss})


def train_drafter_pipeline(target_source: str, out: Path, work: Path, recipe: DrafterRecipe, command: str, allow_download: bool = False, progress: bool = True,
                           target_name: str | None = None) -> dict:
    """Run every stage (cached in ``work``) and install the drafter into ``out``; returns its report
    (its target named ``target_name``, else ``target_source``)."""
    start, timings = time.time(), {}
    _claim_work(work, recipe)
    torch.manual_seed(recipe.seed)
    tokenizer = load_tokenizer(target_source, allow_download)
    target = _frozen_target(target_source, allow_download)
    template = ChatTemplate.of(tokenizer)
    eval_prompts = load_prompt_set("chat")
    with _stage(timings, "conversations_s"):
        shards_read = sum((_shard_folder(work, shard) / "conversations.json").is_file() for shard in range(recipe.shards))
        conversations = write_shards(target, tokenizer, work, recipe, [p["text"] for p in eval_prompts], progress)
    train_part, heldout_part = split_conversations(conversations, recipe)
    vocab, coverage = draft_vocabulary(train_part, min(recipe.drafter.draft_vocab_size, target.config.vocab_size), always=(template.end_of_turn,))
    drafter_config = _drafter_config(recipe, target, vocab, command)
    with _stage(timings, "features_s"):
        parts_before = _feature_parts(work)
        datasets = _datasets(work, target, {"train": train_part, "heldout": heldout_part}, template.end_of_turn, drafter_config.feature_layers, vocab, recipe, progress)
    parts = _feature_parts(work)
    torch.manual_seed(recipe.seed + 3)
    drafter = drafter_model_class(drafter_config).for_target(drafter_config, target).float()
    drafter.set_draft_vocab(vocab)
    with _stage(timings, "training_s"):
        resumed_at, _ = checkpoint_history(work / "checkpoint")
        for _ in with_progress(train(drafter, datasets["train"], recipe.train, checkpoint=work / "checkpoint", heldout=datasets["heldout"]), progress=progress):
            pass
    _, history = checkpoint_history(work / "checkpoint")  # every step's record, also those of a run this one resumed
    heldout = heldout_loss(drafter, datasets["heldout"], soft=recipe.train.soft_top > 0)
    with _stage(timings, "evaluation_s"):
        inference = drafter.served()
        target = target.float()  # tau as served: the default pair runs in float32
        rows = chat_prompt_tau(target, tokenizer, inference, eval_prompts, recipe, progress)
    report = {
        "target": target_name or target_source,
        "recipe": asdict(recipe),
        "command": command,
        "data": {
            "conversations": len(train_part), "heldout_conversations": len(heldout_part),
            "train_anchors": int(datasets["train"].anchors.shape[0]), "response_tokens": train_part.response_tokens,
            "domains": dict(Counter(train_part.domains)), "draft_vocab": int(vocab.numel()), "draft_vocab_coverage": coverage,
            "sample_requests": train_part.requests[:6],
        },
        "parameters": sum(p.numel() for p in inference.parameters()),
        "feature_layers": drafter_config.feature_layers,
        "history": history,
        "heldout": heldout,
        "tau": rows,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        # what this run did not do itself: stages read from the work folder, and the step its training resumed at
        "resumed": {"shards_read": shards_read, "feature_parts_read": len(parts & parts_before), "feature_parts": len(parts), "from_step": resumed_at,
                    "steps_s": round(sum(record["seconds"] for record in history), 1)},
        "total_minutes": round((time.time() - start) / 60, 1),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    install_drafter(inference, out, {"training.json": result_text("training", report)})
    return report


def train_drafter_command(args) -> None:
    recipe = QUICK_RECIPE if args.quick else DrafterRecipe()
    given = lambda names: {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}  # noqa: E731
    recipe = replace(recipe, **given(("shards", "seed")), drafter=replace(recipe.drafter, **given(("hidden_size", "num_layers", "num_heads", "intermediate_size", "conditioning"))),
                     train=replace(recipe.train, **given(("steps", "soft_top"))))  # TrainSettings refuses a bad step count or soft_top
    shape = recipe.drafter
    if min(recipe.shards, shape.hidden_size, shape.num_layers, shape.num_heads, shape.intermediate_size) < 1:
        raise ValueError("--shards, --hidden, --layers, --heads and --intermediate must be at least 1")
    if shape.hidden_size % shape.num_heads:
        raise ValueError(f"--heads ({shape.num_heads}) must divide --hidden ({shape.hidden_size})")
    if recipe.train.soft_top > shape.draft_vocab_size:
        raise ValueError(f"--soft-top must be at most the draft vocabulary size ({shape.draft_vocab_size})")
    out = Path(args.out)
    work = Path(args.work_dir) if args.work_dir else REPO_ROOT / "runs" / f"train-drafter-{out.name}"
    command = shlex.join(["python", "-m", "tev", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith(("tev", "__main__.py")) else "python -m tev train-drafter"
    target = args.target or str(ensure_default_target())
    report = train_drafter_pipeline(target, out, work, recipe, command, allow_download=args.allow_download, target_name=args.target or DEFAULT_TARGET_NAME)
    assets = assets_dir().resolve()
    if assets in out.resolve().parents and (assets / "models" / "build.json").is_file():
        refresh_card(assets)  # the shipped drafter changed: so does the model card
    print(f"drafter written to {out}: held-out loss {report['heldout']['loss']:.3f}, "
          f"top-1 by depth {report['heldout']['top1_by_depth'][:4]}, draft vocabulary covers {100 * report['data']['draft_vocab_coverage']:.1f}% of response tokens")
    for row in report["tau"]:
        print(f"  T={row['temperature']:g} B={row['budget']}: tau {row['tau']:.3f} +- {row['tau_se']:.3f}, mean block length {row['mean_block_length']:.3f} (mean 1 + C {row['tau_bound']:.3f})")
    print(f"{report['total_minutes']:.1f} min")
