"""``python -m tev build-assets``: rebuild the embedded tokenizer and models from scratch.

Stages run in order, each into its own folder under a work directory, each written to a
temporary folder and renamed when complete (a killed build never leaves a half stage):

1. ``tokenizer``: byte-level BPE on the train split of the stdlib corpus.
2. ``target``: a small Llama-architecture causal LM trained on the train split.
3. ``drafter``: the block drafter, self-distilled on the target's own continuations.
4. ``prompts`` + ``card``: evaluation prompt sets and the measured model card.

A stage whose folder exists with the same configuration is reused (so a build can be
resumed); ``--fresh`` ignores them. At the end the finished models replace ``assets/models``.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tev.data.corpus import load_split
from tev.data.prompts import heldout_function_prompts, humaneval_prompts
from tev.data.token_stream import encode_corpus
from tev.engine.block_drafter import BlockDrafter, BlockDrafterConfig
from tev.engine.decode import DecodeConfig, autoregressive_generate
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter, fit_prompt
from tev.engine.models import DEFAULT_PAIR, load_block_drafter
from tev.engine.target import Target
from tev.pipelines.card import refresh_card
from tev.train.data import TrainData, save_train_data
from tev.train.loop import TrainSettings, drafter_shape, fit_to_target, schedule_for, train, with_progress
from tev.train.teacher import corpus_sequences, with_features
from tev.util.files import atomic_folder
from tev.util.paths import REPO_ROOT, assets_dir
from tev.util.stored import result_text
from tev.util.timing import machine_info

__all__ = ["BuildConfig", "QUICK_BUILD", "build_tokenizer", "train_target", "train_drafter", "build_prompts", "build_live_data", "evaluate_assets", "install_assets", "run_build", "build_assets_command"]

EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class BuildConfig:
    """Everything that decides the built assets; seeded, so a rebuild gives the same files."""

    seed: int = 0
    vocab_size: int = 8192
    corpus_limit_files: int | None = None  # None: the whole split
    # target (Llama architecture)
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    context_length: int = 512
    target_steps: int = 1800
    target_batch: int = 8
    target_lr: float = 1.5e-3
    target_warmup: int = 150
    eval_windows: int = 48
    # block drafter (self-distilled on target continuations)
    drafter: BlockDrafterConfig = field(default_factory=lambda: drafter_shape(horizon=8, context_window=16, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=768))
    distill_sequences: int = 3072
    distill_context: int = 128
    distill_new_tokens: int = 96
    drafter_training: TrainSettings = field(default_factory=lambda: TrainSettings(steps=3000, batch=256))  # seeded with seed + 4
    # live ExitTrain data shipped for the app
    live_train_sequences: int = 256
    live_heldout_sequences: int = 32
    live_context: int = 96
    live_new_tokens: int = 64


QUICK_BUILD = BuildConfig(
    vocab_size=384,
    corpus_limit_files=40,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=2,
    context_length=128,
    target_steps=30,
    target_batch=4,
    target_warmup=5,
    eval_windows=4,
    drafter=drafter_shape(horizon=4, context_window=4, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    distill_sequences=32,
    distill_context=16,
    distill_new_tokens=16,
    drafter_training=TrainSettings(steps=20, batch=32),
    live_train_sequences=8,
    live_heldout_sequences=4,
    live_context=16,
    live_new_tokens=16,
)


def config_key(config: BuildConfig, *fields: str) -> dict:
    values = asdict(config)
    return {name: values[name] for name in fields}


def _marker(work: Path, stage: str) -> dict:
    """What a finished stage recorded: its ``config`` key and measurements."""
    return json.loads((work / stage / "stage.json").read_text())


def _reused(folder: Path, key: dict, log) -> bool:
    """Whether ``folder`` holds its stage built with ``key`` (then the stage is skipped)."""
    if (folder / "stage.json").exists() and _marker(folder.parent, folder.name).get("config") == key:
        log(f"{folder.name}: reusing {folder}")
        return True
    return False


def _built_target(work: Path):
    """(tokenizer, target in float32 and eval mode) of the target stage."""
    return (AutoTokenizer.from_pretrained(work / "target", local_files_only=True),
            LlamaForCausalLM.from_pretrained(work / "target", dtype=torch.float32, local_files_only=True).eval())


def _write_marker(folder: Path, key: dict, **extra) -> None:
    (folder / "stage.json").write_text(json.dumps({"config": key, **extra}, indent=2))


# ---------------------------------------------------------------------- tokenizer
def build_tokenizer(work: Path, config: BuildConfig, log=print) -> Path:
    """Byte-level BPE on the train split; saved for ``AutoTokenizer.from_pretrained``."""
    folder = work / "tokenizer"
    key = config_key(config, "vocab_size", "corpus_limit_files")
    if _reused(folder, key, log):
        return folder
    start = time.time()
    files = load_split("train", limit_files=config.corpus_limit_files)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator((f.text for f in files), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOS_TOKEN,  # documents start with the separator, as in training
        eos_token=EOS_TOKEN,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=config.context_length,
    )
    with atomic_folder(folder) as tmp:
        tokenizer.save_pretrained(tmp)
        _write_marker(tmp, key, seconds=time.time() - start, train_files=len(files))
    log(f"tokenizer: {bpe.get_vocab_size()} tokens trained on {len(files)} files in {time.time() - start:.0f}s")
    return folder


# ---------------------------------------------------------------------- target
def target_config(config: BuildConfig, tokenizer):
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.context_length,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )


def random_windows(stream: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """`LongTensor[count, length]` windows at random offsets of ``stream``."""
    starts = torch.randint(0, stream.numel() - length, (count,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


@torch.no_grad()
def lm_loss(model, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token loss in nats over ``windows`` (`LongTensor[n, T]`)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        chunk = windows[i : i + batch]
        logits = model(input_ids=chunk).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += chunk[:, 1:].numel()
    model.train()
    return total / count


def train_target(work: Path, config: BuildConfig, log=print) -> Path:
    """Train the target LM on random windows of the train stream; save it in bfloat16."""
    folder = work / "target"
    key = config_key(
        config, "seed", "vocab_size", "corpus_limit_files", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "context_length", "target_steps", "target_batch", "target_lr", "target_warmup", "eval_windows",
    )
    if _reused(folder, key, log):
        return folder
    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer", local_files_only=True)
    train_stream, _ = encode_corpus(tokenizer, "train", config.corpus_limit_files)
    heldout_stream, heldout_bytes = encode_corpus(tokenizer, "heldout")
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(target_config(config, tokenizer))
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=config.target_lr, betas=(0.9, 0.95)
    )
    schedule = schedule_for(optimizer, config.target_warmup, config.target_steps)
    data_generator = torch.Generator().manual_seed(config.seed)
    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    eval_windows = random_windows(heldout_stream, config.eval_windows, config.context_length, eval_generator)
    length = config.context_length + 1
    history = []
    bar = tqdm(range(config.target_steps), desc="target", unit="step")
    for step in bar:
        batch = random_windows(train_stream, config.target_batch, length, data_generator)
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss  # labels shift inside the model
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % max(1, config.target_steps // 10) == 0 or step + 1 == config.target_steps:
            history.append({"step": step + 1, "train_loss": loss.item(), "heldout_loss": lm_loss(model, eval_windows)})
    seconds = time.time() - start
    # Save in bfloat16 (half the size); everything downstream uses the saved weights.
    model = model.to(torch.bfloat16)
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        reloaded = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32, local_files_only=True)
        nats = lm_loss(reloaded, eval_windows)
        full_nats = lm_loss(reloaded, _all_windows(heldout_stream, config.context_length + 1))
        tokens_per_byte = heldout_stream.numel() / heldout_bytes
        _write_marker(
            tmp,
            key,
            seconds=seconds,
            parameters=parameters,
            tokens_seen=config.target_steps * config.target_batch * config.context_length,
            train_tokens=train_stream.numel(),
            heldout_tokens=heldout_stream.numel(),
            heldout_nats_per_token=full_nats,
            heldout_bits_per_byte=full_nats * tokens_per_byte / math.log(2),
            eval_window_nats=nats,
            history=history,
        )
    log(f"target: {parameters / 1e6:.2f}M parameters, held-out {full_nats:.3f} nats/token, {seconds / 60:.1f} min")
    return folder


def _all_windows(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows covering the stream (the tail shorter than ``length`` dropped)."""
    count = stream.numel() // length
    return stream[: count * length].view(count, length)


# ---------------------------------------------------------------------- block drafter
DRAFTER_FIELDS = (
    "drafter",
    "distill_sequences", "distill_context", "distill_new_tokens", "drafter_training", "seed",
)


def train_drafter(work: Path, config: BuildConfig, log=print) -> Path:
    """Self-distil the base block drafter on the target's own continuations (L_tok only)."""
    folder = work / "drafter"
    key = {**config_key(config, *DRAFTER_FIELDS), "target": _marker(work, "target")["config"]}
    if _reused(folder, key, log):
        return folder
    start = time.time()
    tokenizer, target = _built_target(work)
    target.requires_grad_(False)
    drafter_config = fit_to_target(config.drafter, target, notes={"trained_by": "python -m tev build-assets", "loss": "token-level cross-entropy on target continuations"})
    sequences = corpus_sequences(target, tokenizer, "train", config.distill_sequences, config.distill_context, config.distill_new_tokens, seed=config.seed + 2,
                                 limit_files=config.corpus_limit_files)
    data = with_features(target, TrainData.of(sequences, config.distill_context), drafter_config.feature_layers)
    data_seconds = time.time() - start
    torch.manual_seed(config.seed + 3)
    drafter = BlockDrafter.for_target(drafter_config, target)
    history = list(with_progress(train(drafter, data, replace(config.drafter_training, seed=config.seed + 4))))
    seconds = time.time() - start
    parameters = sum(p.numel() for p in drafter.parameters())
    with atomic_folder(folder) as tmp:
        drafter.save_pretrained(tmp)
        _write_marker(
            tmp, key, seconds=seconds, data_seconds=data_seconds, parameters=parameters,
            anchors=data.num_anchors, history=history,
        )
    log(f"drafter: {parameters / 1e6:.2f}M parameters, {data.num_anchors} anchors, final loss {history[-1]['running_loss']:.3f}, {seconds / 60:.1f} min")
    return folder


# ---------------------------------------------------------------------- prompts
def build_prompts(work: Path, config: BuildConfig, log=print) -> Path:
    """``heldout.json`` (function headers + docstrings, held-out files) and ``humaneval.json``."""
    folder = work / "prompts"
    key = {"python": platform.python_version(), "count": 64}
    if _reused(folder, key, log):
        return folder
    with atomic_folder(folder) as tmp:
        sets = [heldout_function_prompts(count=64)]
        try:
            sets.append(humaneval_prompts())
        except FileNotFoundError as error:
            log(f"prompts: skipping HumanEval ({error})")
        for prompt_set in sets:
            (tmp / f"{prompt_set['name']}.json").write_text(json.dumps(prompt_set, indent=1, ensure_ascii=False) + "\n")
        _write_marker(tmp, key, sets=[s["name"] for s in sets])
    log("prompts: " + ", ".join(f"{s['name']} ({len(s['prompts'])})" for s in sets))
    return folder


# ---------------------------------------------------------------------- live ExitTrain data
def build_live_data(work: Path, config: BuildConfig, log=print) -> Path:
    """Target-regenerated sequences for the app's live ExitTrain mode (train + held-out)."""
    folder = work / "live-data"
    context, new_tokens = config.live_context, config.live_new_tokens
    key = {**config_key(config, "seed", "live_train_sequences", "live_heldout_sequences", "live_context", "live_new_tokens"), "target": _marker(work, "target")["config"]}
    if _reused(folder, key, log):
        return folder
    tokenizer, target = _built_target(work)
    parts = {name: TrainData.of(corpus_sequences(target, tokenizer, name, count, context, new_tokens, seed, limit_files=files), context)
             for name, count, files, seed in (("train", config.live_train_sequences, config.corpus_limit_files, config.seed + 5),
                                              ("heldout", config.live_heldout_sequences, None, config.seed + 6))}
    with atomic_folder(folder) as tmp:
        save_train_data(tmp / "exittrain-data.safetensors", parts)
        _write_marker(tmp, key)
    log(f"live data: {len(parts['train'])} train and {len(parts['heldout'])} held-out sequences of {context + new_tokens} tokens")
    return folder


# ---------------------------------------------------------------------- evaluation for the card
def evaluate_assets(work: Path, config: BuildConfig, quick: bool, log=print) -> dict:
    """Measure what the model card reports, on the built files (never on training data)."""
    tokenizer, target = _built_target(work)
    runner = Target(target)  # transformers' forward: none is chosen for a model being built
    drafter = load_block_drafter(work / "drafter", target, name="block")
    heldout = json.loads((work / "prompts" / "heldout.json").read_text())["prompts"]
    count, new_tokens = (2, 12) if quick else (24, 64)
    prompts = heldout[:: max(1, len(heldout) // count)][:count]
    start = time.time()
    samples = []
    for prompt in heldout[1:: max(1, len(heldout) // 3)][:3]:
        ids = fit_prompt(tokenizer, prompt, config.context_length - new_tokens)
        summary = autoregressive_generate(runner, ids, DecodeConfig(temperature=0.0, max_new_tokens=new_tokens), tokenizer)
        samples.append({"id": prompt["id"], "prompt": prompt["text"], "continuation": summary.text})
    budgets = (8,) if quick else (8, 16, 32, 64)
    tau_rows = evaluate_drafter(runner, tokenizer, drafter, prompts, budgets=budgets, temperatures=(0.0, 1.0), max_new_tokens=new_tokens, desc="card: tau")
    horizons = []
    for horizon in [drafter.horizon] if quick else sorted({drafter.horizon // 2, (3 * drafter.horizon) // 4, drafter.horizon}):
        capped = BlockTreeDrafter(drafter.model, name="block", horizon=horizon)
        row = evaluate_drafter(runner, tokenizer, capped, prompts, budgets=(16,), temperatures=(0.0,), max_new_tokens=new_tokens, desc=f"card: horizon {horizon}", progress=False)[0]
        horizons.append({"horizon": horizon, **row})
    humaneval_rows = []
    humaneval_path = work / "prompts" / "humaneval.json"
    if humaneval_path.is_file():
        humaneval = json.loads(humaneval_path.read_text())["prompts"]
        subset = humaneval[:: max(1, len(humaneval) // count)][:count]
        humaneval_rows = evaluate_drafter(runner, tokenizer, drafter, subset, budgets=(8,) if quick else (16, 32), temperatures=(1.0,) if quick else (0.0, 1.0), max_new_tokens=new_tokens, desc="card: humaneval")
    result = {
        "samples": samples,
        "tau": tau_rows,
        "horizons": horizons,
        "humaneval_tau": humaneval_rows,
        "eval_prompts": len(prompts),
        "eval_new_tokens": new_tokens,
        "seconds": time.time() - start,
    }
    log(f"evaluation: {time.time() - start:.0f}s")
    return result


# ---------------------------------------------------------------------- install and card
def install_assets(work: Path, out: Path, report: dict, log=print) -> None:
    """Assemble ``models/`` and ``prompts/`` in staging folders beside ``out``'s, swap both in
    once both are complete, then write the model card."""
    with atomic_folder(out / "models") as models, atomic_folder(out / "prompts") as prompts:
        shutil.copytree(work / "target", models / "target", ignore=shutil.ignore_patterns("stage.json"))
        shutil.copytree(work / "drafter", models / "drafter-base", ignore=_only("drafter_config.json", "drafter.safetensors"))
        if (work / "exittrain" / "drafter.safetensors").is_file():
            shutil.copytree(work / "exittrain", models / "drafter-exittrain", ignore=_only("drafter_config.json", "drafter.safetensors"))
        shutil.copy2(work / "live-data" / "exittrain-data.safetensors", models / "exittrain-data.safetensors")
        (models / "build.json").write_text(result_text("build", report, indent=2))
        if (out / "models" / DEFAULT_PAIR.home).is_dir():  # the default pair's drafters are not built here: keep them
            shutil.copytree(out / "models" / DEFAULT_PAIR.home, models / DEFAULT_PAIR.home)
        for path in (out / "prompts").glob("*.json") if (out / "prompts").is_dir() else ():
            shutil.copy2(path, prompts / path.name)  # e.g. the chat prompts; the build's own sets replace theirs below
        for path in (work / "prompts").glob("*.json"):
            if path.name != "stage.json":
                shutil.copy2(path, prompts / path.name)
    refresh_card(out)
    log(f"installed into {out}")


def _only(*keep: str):
    """A ``shutil.copytree`` ignore function that copies only the files named ``keep``."""
    return lambda folder, names: [name for name in names if name not in keep]


def run_build(config: BuildConfig, work: Path, out: Path, quick: bool, fresh: bool, command: str, log=print) -> dict:
    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    stages = [("tokenizer", 1), ("target", config.target_steps * 2.3 / 60), ("prompts", 0.3), ("drafter", 4 + config.drafter_training.steps * 0.45 / 60), ("live data", 1), ("evaluation", 6)]
    if quick:
        log("quick build: a miniature pipeline (seconds)")
    else:
        log("build plan (estimated minutes on 2 CPU cores): " + ", ".join(f"{name} ~{minutes:.0f}" for name, minutes in stages))
    build_tokenizer(work, config, log)
    train_target(work, config, log)
    build_prompts(work, config, log)
    train_drafter(work, config, log)
    build_live_data(work, config, log)
    evaluation = evaluate_assets(work, config, quick, log)
    target_marker, drafter_marker = _marker(work, "target"), _marker(work, "drafter")
    drafter_config = json.loads((work / "drafter" / "drafter_config.json").read_text())
    report = {
        "command": command,
        "built": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "machine": machine_info("cpu"),
        "config": asdict(config),
        "seconds": time.time() - start
        + sum(_marker(work, s).get("seconds", 0.0) for s in ("tokenizer", "target", "drafter")),
        "target": {k: v for k, v in target_marker.items() if k != "config"},
        "drafter": {**{k: v for k, v in drafter_marker.items() if k != "config"}, "feature_layers": drafter_config["feature_layers"]},
        "evaluation": evaluation,
    }
    install_assets(work, out, report, log)
    return report


def build_assets_command(args) -> None:
    config = QUICK_BUILD if args.quick else BuildConfig()
    work = Path(args.work_dir) if args.work_dir else REPO_ROOT / "runs" / ("build-assets-quick" if args.quick else "build-assets")
    command = "python -m tev build-assets" + (" --quick" if args.quick else "")
    run_build(config, work, Path(args.out) if args.out else assets_dir(), args.quick, args.fresh, command)
