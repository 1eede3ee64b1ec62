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
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tev.util.paths import REPO_ROOT
from tqdm import tqdm

from tev.data.corpus import load_split

__all__ = ["BuildConfig", "QUICK_BUILD", "build_tokenizer", "train_target", "train_drafter", "atomic_folder"]

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
    drafter_horizon: int = 8
    drafter_window: int = 16
    drafter_hidden: int = 256
    drafter_layers: int = 2
    drafter_heads: int = 4
    drafter_intermediate: int = 768
    distill_sequences: int = 3072
    distill_context: int = 128
    distill_new_tokens: int = 96
    drafter_steps: int = 3000
    drafter_batch: int = 256
    drafter_lr: float = 1e-3
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
    drafter_horizon=4,
    drafter_window=4,
    drafter_hidden=32,
    drafter_layers=1,
    drafter_heads=2,
    drafter_intermediate=64,
    distill_sequences=32,
    distill_context=16,
    distill_new_tokens=16,
    drafter_steps=20,
    drafter_batch=32,
    live_train_sequences=8,
    live_heldout_sequences=4,
    live_context=16,
    live_new_tokens=16,
)


def config_key(config: BuildConfig, *fields: str) -> dict:
    values = asdict(config)
    return {name: values[name] for name in fields}


class atomic_folder:
    """Write into ``<final>.tmp-<pid>`` and rename to ``final`` only on success.

    ``final`` must not exist yet (callers remove a stale stage first).
    """

    def __init__(self, final: Path):
        self.final = Path(final)
        self.temporary = self.final.with_name(f".{self.final.name}.tmp-{os.getpid()}")

    def __enter__(self) -> Path:
        shutil.rmtree(self.temporary, ignore_errors=True)
        self.temporary.mkdir(parents=True)
        return self.temporary

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
            return
        os.replace(self.temporary, self.final)


def _stage_ready(folder: Path, key: dict) -> bool:
    marker = folder / "stage.json"
    return marker.exists() and json.loads(marker.read_text()).get("config") == key


def _write_marker(folder: Path, key: dict, **extra) -> None:
    (folder / "stage.json").write_text(json.dumps({"config": key, **extra}, indent=2))


# ---------------------------------------------------------------------- tokenizer
def build_tokenizer(work: Path, config: BuildConfig, log=print) -> Path:
    """Byte-level BPE on the train split; saved for ``AutoTokenizer.from_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = work / "tokenizer"
    key = config_key(config, "vocab_size", "corpus_limit_files")
    if _stage_ready(folder, key):
        log(f"tokenizer: reusing {folder}")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
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


def encode_corpus(tokenizer, split: str, config: BuildConfig) -> tuple[torch.Tensor, int]:
    """The split as one stream ``[EOS, file 1, EOS, file 2, ...]``; returns (ids, UTF-8 bytes)."""
    files = load_split(split, limit_files=config.corpus_limit_files if split == "train" else None)
    encoded = tokenizer([f.text for f in files], add_special_tokens=False, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    stream = []
    for ids in encoded:
        stream.append(eos)
        stream.extend(ids)
    return torch.tensor(stream, dtype=torch.long), sum(len(f.text.encode("utf-8")) for f in files)


# ---------------------------------------------------------------------- target
def target_config(config: BuildConfig, tokenizer):
    from transformers import LlamaConfig

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
def heldout_loss(model, windows: torch.Tensor, batch: int = 8) -> float:
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
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = work / "target"
    key = config_key(
        config, "seed", "vocab_size", "corpus_limit_files", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "context_length", "target_steps", "target_batch", "target_lr", "target_warmup", "eval_windows",
    )
    if _stage_ready(folder, key):
        log(f"target: reusing {folder}")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer", local_files_only=True)
    train_stream, _ = encode_corpus(tokenizer, "train", config)
    heldout_stream, heldout_bytes = encode_corpus(tokenizer, "heldout", config)
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(target_config(config, tokenizer))
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=config.target_lr, betas=(0.9, 0.95)
    )

    def learning_rate(step: int) -> float:
        if step < config.target_warmup:
            return config.target_lr * (step + 1) / config.target_warmup
        progress = (step - config.target_warmup) / max(1, config.target_steps - config.target_warmup)
        return config.target_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    data_generator = torch.Generator().manual_seed(config.seed)
    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    eval_windows = random_windows(heldout_stream, config.eval_windows, config.context_length, eval_generator)
    length = config.context_length + 1
    history = []
    bar = tqdm(range(config.target_steps), desc="target", unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        batch = random_windows(train_stream, config.target_batch, length, data_generator)
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss  # labels shift inside the model
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % max(1, config.target_steps // 10) == 0 or step + 1 == config.target_steps:
            history.append({"step": step + 1, "train_loss": loss.item(), "heldout_loss": heldout_loss(model, eval_windows)})
    seconds = time.time() - start
    # Save in bfloat16 (half the size); everything downstream uses the saved weights.
    model = model.to(torch.bfloat16)
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        reloaded = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32, local_files_only=True)
        nats = heldout_loss(reloaded, eval_windows)
        full_nats = heldout_loss(reloaded, _all_windows(heldout_stream, config.context_length + 1))
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
    "drafter_horizon", "drafter_window", "drafter_hidden", "drafter_layers", "drafter_heads", "drafter_intermediate",
    "distill_sequences", "distill_context", "distill_new_tokens", "drafter_steps", "drafter_batch", "drafter_lr", "seed",
)


def train_drafter(work: Path, config: BuildConfig, log=print) -> Path:
    """Self-distil the base block drafter on the target's own continuations (L_tok only)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tev.train.distill import make_distill_data, train_block_drafter
    from tev.engine.drafters import BlockDrafter, BlockDrafterConfig, default_feature_layers

    folder = work / "drafter"
    target_marker = json.loads((work / "target" / "stage.json").read_text())
    key = {**config_key(config, *DRAFTER_FIELDS), "target": target_marker["config"]}
    if _stage_ready(folder, key):
        log(f"drafter: reusing {folder}")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(work / "target", local_files_only=True)
    target = LlamaForCausalLM.from_pretrained(work / "target", dtype=torch.float32, local_files_only=True).eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    train_stream, _ = encode_corpus(tokenizer, "train", config)
    drafter_config = BlockDrafterConfig(
        vocab_size=target.config.vocab_size,
        target_hidden_size=target.config.hidden_size,
        feature_layers=default_feature_layers(target.config.num_hidden_layers),
        horizon=config.drafter_horizon,
        context_window=config.drafter_window,
        hidden_size=config.drafter_hidden,
        num_layers=config.drafter_layers,
        num_heads=config.drafter_heads,
        intermediate_size=config.drafter_intermediate,
        target_num_layers=target.config.num_hidden_layers,
        notes={"trained_by": "python -m tev build-assets", "loss": "token-level cross-entropy on target continuations"},
    )
    data = make_distill_data(
        target, train_stream, drafter_config.feature_layers, config.distill_sequences, config.distill_context,
        config.distill_new_tokens, seed=config.seed + 2,
    )
    data_seconds = time.time() - start
    torch.manual_seed(config.seed + 3)
    drafter = BlockDrafter.for_target(drafter_config, target)
    history = train_block_drafter(drafter, data, config.drafter_steps, config.drafter_batch, config.drafter_lr, seed=config.seed + 4)
    seconds = time.time() - start
    parameters = sum(p.numel() for p in drafter.parameters())
    with atomic_folder(folder) as tmp:
        drafter.save_pretrained(tmp)
        _write_marker(
            tmp, key, seconds=seconds, data_seconds=data_seconds, parameters=parameters,
            anchors=data.num_anchors, history=history,
        )
    log(f"drafter: {parameters / 1e6:.2f}M parameters, {data.num_anchors} anchors, final loss {history[-1]['loss']:.3f}, {seconds / 60:.1f} min")
    return folder


# ---------------------------------------------------------------------- prompts
def build_prompts(work: Path, config: BuildConfig, log=print) -> Path:
    """``heldout.json`` (function headers + docstrings, held-out files) and ``humaneval.json``."""
    from tev.data.prompts import heldout_function_prompts, humaneval_prompts

    folder = work / "prompts"
    key = {"python": platform.python_version(), "count": 64}
    if _stage_ready(folder, key):
        log(f"prompts: reusing {folder}")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
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
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tev.train.distill import regenerate_sequences

    folder = work / "live-data"
    target_marker = json.loads((work / "target" / "stage.json").read_text())
    context, new_tokens = config.live_context, config.live_new_tokens
    key = {**config_key(config, "seed", "live_train_sequences", "live_heldout_sequences", "live_context", "live_new_tokens"), "target": target_marker["config"]}
    if _stage_ready(folder, key):
        log(f"live data: reusing {folder}")
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(work / "target", local_files_only=True)
    target = LlamaForCausalLM.from_pretrained(work / "target", dtype=torch.float32, local_files_only=True).eval()
    train_stream, _ = encode_corpus(tokenizer, "train", config)
    heldout_stream, _ = encode_corpus(tokenizer, "heldout", config)
    train = regenerate_sequences(target, train_stream, config.live_train_sequences, context, new_tokens, seed=config.seed + 5, desc="live train sequences")
    heldout = regenerate_sequences(target, heldout_stream, config.live_heldout_sequences, context, new_tokens, seed=config.seed + 6, desc="live held-out sequences")
    with atomic_folder(folder) as tmp:
        save_file(
            {"train": train.to(torch.int16 if len(tokenizer) < 2**15 else torch.int32), "heldout": heldout.to(torch.int16 if len(tokenizer) < 2**15 else torch.int32),
             "first_anchor": torch.tensor([context - 1])},
            tmp / "exittrain-data.safetensors",
            metadata={"source": "contexts from the corpus (train / held-out splits), continuations sampled from the target"},
        )
        _write_marker(tmp, key)
    log(f"live data: {train.shape[0]} train and {heldout.shape[0]} held-out sequences of {context + new_tokens} tokens")
    return folder


# ---------------------------------------------------------------------- evaluation for the card
def evaluate_assets(work: Path, config: BuildConfig, quick: bool, log=print) -> dict:
    """Measure what the model card reports, on the built files (never on training data)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tev.bench.benchmarks import evaluate_drafter, fit_prompt
    from tev.engine.decode import GenerationConfig, autoregressive_generate
    from tev.engine.drafters import BlockTreeDrafter
    from tev.engine.models import load_block_drafter

    tokenizer = AutoTokenizer.from_pretrained(work / "target", local_files_only=True)
    target = LlamaForCausalLM.from_pretrained(work / "target", dtype=torch.float32, local_files_only=True).eval()
    drafter = load_block_drafter(work / "drafter", target, name="block")
    heldout = json.loads((work / "prompts" / "heldout.json").read_text())["prompts"]
    count, new_tokens = (2, 12) if quick else (24, 64)
    prompts = heldout[:: max(1, len(heldout) // count)][:count]
    start = time.time()
    samples = []
    for prompt in heldout[1:: max(1, len(heldout) // 3)][:3]:
        ids = fit_prompt(tokenizer, prompt, config.context_length - new_tokens)
        summary = autoregressive_generate(target, ids, GenerationConfig(temperature=0.0, max_new_tokens=new_tokens), tokenizer)
        samples.append({"id": prompt["id"], "prompt": prompt["text"], "continuation": summary.text})
    budgets = (8,) if quick else (8, 16, 32, 64)
    tau_rows = evaluate_drafter(target, tokenizer, drafter, prompts, budgets=budgets, temperatures=(0.0, 1.0), max_new_tokens=new_tokens, desc="card: tau")
    horizons = []
    for horizon in [drafter.horizon] if quick else sorted({drafter.horizon // 2, (3 * drafter.horizon) // 4, drafter.horizon}):
        capped = BlockTreeDrafter(drafter.model, name="block", horizon=horizon)
        row = evaluate_drafter(target, tokenizer, capped, prompts, budgets=(16,), temperatures=(0.0,), max_new_tokens=new_tokens, desc=f"card: horizon {horizon}", progress=False)[0]
        horizons.append({"horizon": horizon, **row})
    humaneval_rows = []
    humaneval_path = work / "prompts" / "humaneval.json"
    if humaneval_path.is_file():
        humaneval = json.loads(humaneval_path.read_text())["prompts"]
        subset = humaneval[:: max(1, len(humaneval) // count)][:count]
        humaneval_rows = evaluate_drafter(target, tokenizer, drafter, subset, budgets=(8,) if quick else (16, 32), temperatures=(1.0,) if quick else (0.0, 1.0), max_new_tokens=new_tokens, desc="card: humaneval")
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
def _replace_folder(source: Path, destination: Path) -> None:
    """Copy ``source`` next to ``destination`` and swap it in with renames (never half-written)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staged = destination.with_name(f".{destination.name}.new-{os.getpid()}")
    retired = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(source, staged)
    if destination.exists():
        os.replace(destination, retired)
    os.replace(staged, destination)
    shutil.rmtree(retired, ignore_errors=True)


def install_assets(work: Path, out: Path, report: dict, log=print) -> None:
    """Assemble models/ and prompts/ in staging folders, then swap each in."""
    staging = work / "install"
    shutil.rmtree(staging, ignore_errors=True)
    models = staging / "models"
    (models / "target").mkdir(parents=True)
    for name in os.listdir(work / "target"):
        if name != "stage.json":
            shutil.copy2(work / "target" / name, models / "target" / name)
    (models / "drafter-base").mkdir()
    for name in ("drafter_config.json", "drafter.safetensors"):
        shutil.copy2(work / "drafter" / name, models / "drafter-base" / name)
    if (work / "exittrain" / "drafter.safetensors").is_file():
        (models / "drafter-exittrain").mkdir()
        for name in ("drafter_config.json", "drafter.safetensors"):
            shutil.copy2(work / "exittrain" / name, models / "drafter-exittrain" / name)
    shutil.copy2(work / "live-data" / "exittrain-data.safetensors", models / "exittrain-data.safetensors")
    (models / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    prompts = staging / "prompts"
    prompts.mkdir()
    for name in os.listdir(work / "prompts"):
        if name.endswith(".json") and name != "stage.json":
            shutil.copy2(work / "prompts" / name, prompts / name)
    _replace_folder(models, out / "models")
    _replace_folder(prompts, out / "prompts")
    card = out / "README.md"
    card_tmp = out / f".README.md.tmp-{os.getpid()}"
    card_tmp.write_text(render_card(report))
    os.replace(card_tmp, card)
    shutil.rmtree(staging, ignore_errors=True)
    log(f"installed into {out}")


def render_card(report: dict) -> str:
    """The model card (``assets/README.md``) from a build report."""
    from tev.bench.benchmarks import format_tau_table

    target, drafter, evaluation = report["target"], report["drafter"], report["evaluation"]
    cfg = report["config"]
    lines = [
        "# Embedded models: model card",
        "",
        "The default models of TEV Explorer, trained by this repository's own script:",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"Built {report['built']} on {report['machine']['cpu']} ({report['machine']['torch_threads']} threads, torch {report['machine']['torch']}), "
        f"seed {cfg['seed']}, total build time {report['seconds'] / 60:.0f} min.",
        "",
        "## Corpus and split",
        "",
        f"The Python {report['python']} standard library source (`sysconfig.get_paths()['stdlib']`, `.py` files, installed packages excluded), "
        f"split by file: a file is held out when `sha256(relative path) mod 100 < 5`. Train: {target['train_tokens']:,} tokens; "
        f"held-out: {target['heldout_tokens']:,} tokens (never trained on). Files that do not decode as UTF-8 are skipped.",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE (`tokenizers`), {cfg['vocab_size']} tokens including `<|endoftext|>` (document separator, also used as BOS); "
        "decoding round-trips exactly. Load with `AutoTokenizer.from_pretrained('assets/models/target', local_files_only=True)`.",
        "",
        "## Target `p`",
        "",
        f"Llama architecture: {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, MLP {cfg['intermediate_size']}, {cfg['num_heads']} heads, "
        f"context {cfg['context_length']}, tied embeddings; {target['parameters'] / 1e6:.2f}M parameters, stored in bfloat16 safetensors.",
        f"Trained {cfg['target_steps']} steps x {cfg['target_batch']} x {cfg['context_length']} tokens = {target['tokens_seen']:,} tokens seen "
        f"(AdamW, peak lr {cfg['target_lr']}, cosine), {target['seconds'] / 60:.0f} min on CPU.",
        "",
        f"Held-out loss (all held-out tokens, the saved bf16 weights run in fp32): **{target['heldout_nats_per_token']:.3f} nats/token, "
        f"{target['heldout_bits_per_byte']:.3f} bits/byte**.",
        "",
        "## Block drafter `q` (base)",
        "",
        f"One-pass block drafter (this repo's `tev.engine.drafters.BlockDrafter`): reads the target's hidden states at layers {drafter['feature_layers']} "
        f"for the last {cfg['drafter_window']} committed positions plus the root token and emits K = {cfg['drafter_horizon']} per-depth marginals "
        f"in one forward; {cfg['drafter_layers']} blocks of width {cfg['drafter_hidden']}; shares the target's embedding and output head (frozen). "
        f"{drafter['parameters'] / 1e6:.2f}M own parameters.",
        f"Self-distilled with token-level cross-entropy only on {cfg['distill_sequences']} target continuations "
        f"({cfg['distill_new_tokens']} new tokens after {cfg['distill_context']}-token train-split contexts; half greedy, half sampled at T = 1), "
        f"{drafter['anchors']:,} anchors, {cfg['drafter_steps']} steps x {cfg['drafter_batch']}; {drafter['seconds'] / 60:.0f} min. "
        f"Final training loss {drafter['history'][-1]['loss']:.3f} nats per depth.",
        "",
        "## Drafter `tau` on held-out prompts",
        "",
        f"`tau` = mean output-block length (accepted draft tokens + 1 bonus) over all rounds, TEV verifier (greedy at T = 0), "
        f"{evaluation['eval_prompts']} held-out function prompts, {evaluation['eval_new_tokens']} new tokens each; `1 + C` is the mean "
        "coverage bound of the same rounds. Measure again with:",
        "",
        "```bash",
        "python -m tev bench e2e --prompts heldout   # tau and speed vs autoregressive",
        "```",
        "",
        format_tau_table(evaluation["tau"]),
        "",
        "Horizon check (B = 16, T = 0): "
        + ", ".join(f"K = {h['horizon']}: tau {h['tau']:.3f}" for h in evaluation["horizons"])
        + ".",
        "",
    ]
    if evaluation.get("humaneval_tau"):
        lines += ["HumanEval prompts (same drafter):", "", format_tau_table(evaluation["humaneval_tau"]), ""]
    if report.get("exittrain"):
        lines += _exittrain_card_lines(report["exittrain"])
    lines += ["## Greedy samples from the target (held-out prompts, shown as they are)", ""]
    for sample in evaluation["samples"]:
        lines += [f"`{sample['id']}`", "", "```python", sample["prompt"] + sample["continuation"], "```", ""]
    lines += [
        "## Rebuild",
        "",
        "`python -m tev build-assets` rebuilds everything from scratch, seeded (`--quick` builds a miniature in seconds). "
        "Stages are cached under `runs/build-assets/` and a finished build replaces `assets/models/` and `assets/prompts/` by renames. "
        "The corpus is the running interpreter's standard library, so another Python version gives a (slightly) different corpus.",
        "",
    ]
    return "\n".join(lines)


def _exittrain_card_lines(entry: dict) -> list[str]:
    """The card's ExitTrain section, from the report ``python -m tev exittrain --install`` writes."""
    from tev.bench.benchmarks import format_tau_table

    config = entry["config"]
    lines = [
        "## ExitTrain drafter `q` (fine-tuned from the base drafter)",
        "",
        "Trained by:",
        "",
        "```bash",
        entry.get("command", "python -m tev exittrain --install"),
        "```",
        "",
        f"Exit-weighted loss `L_tok + {config['lambda_exit']:g} L_exit` ({config['weights']} weights), training trees of budget "
        f"{config['budget']} scored by the frozen target at T = {config['temperature']:g}; {entry['steps_done']} steps x "
        f"{config['sequences_per_step'] * config['anchors_per_sequence']} anchors ({config['sequences_per_step']} target-regenerated sequences x "
        f"{config['anchors_per_sequence']} anchors), lr {config['lr']:g}; {entry['seconds'] / 60:.1f} min on CPU.",
        f"Held-out expected `1 + C` (T = {config['temperature']:g}, fixed anchors in held-out target-regenerated text, half greedy and half sampled): {entry['heldout_expected_tau_before']:.3f} before, "
        f"{entry['heldout_expected_tau_after']:.3f} after.",
        "",
    ]
    for name, title in (("before", "base drafter"), ("after", "ExitTrain drafter")):
        if entry.get("tau", {}).get(name) and not entry.get("ablation"):  # the ablation table holds both
            lines += [f"Decoding `tau` on held-out prompts, {title}:", "", format_tau_table(entry["tau"][name]), ""]
    if entry.get("ablation"):
        lines += ["Ablation from the same run (equal data, steps and seed; TEV decoding `tau` on held-out prompts):", "", entry["ablation"], ""]
    return lines


def refresh_card(assets: Path) -> None:
    """Re-render ``assets/README.md`` from ``models/build.json`` and, when present, the
    installed ExitTrain drafter's ``exittrain.json``."""
    report = json.loads((assets / "models" / "build.json").read_text())
    exittrain = assets / "models" / "drafter-exittrain" / "exittrain.json"
    if exittrain.is_file():
        report["exittrain"] = json.loads(exittrain.read_text())
    temporary = assets / f".README.md.tmp-{os.getpid()}"
    temporary.write_text(render_card(report))
    os.replace(temporary, assets / "README.md")


def run_build(config: BuildConfig, work: Path, out: Path, quick: bool, fresh: bool, command: str, log=print) -> dict:
    from tev.util.timing import machine_info

    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    stages = [("tokenizer", 1), ("target", config.target_steps * 2.3 / 60), ("prompts", 0.3), ("drafter", 4 + config.drafter_steps * 0.45 / 60), ("live data", 1), ("evaluation", 6)]
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
    target_marker = json.loads((work / "target" / "stage.json").read_text())
    drafter_marker = json.loads((work / "drafter" / "stage.json").read_text())
    drafter_config = json.loads((work / "drafter" / "drafter_config.json").read_text())
    report = {
        "command": command,
        "built": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "machine": machine_info("cpu"),
        "config": asdict(config),
        "seconds": time.time() - start
        + sum(json.loads((work / s / "stage.json").read_text()).get("seconds", 0.0) for s in ("tokenizer", "target", "drafter")),
        "target": {k: v for k, v in target_marker.items() if k != "config"},
        "drafter": {**{k: v for k, v in drafter_marker.items() if k != "config"}, "feature_layers": drafter_config["feature_layers"]},
        "evaluation": evaluation,
    }
    install_assets(work, out, report, log)
    return report


def build_assets_command(args) -> None:
    import sys

    config = QUICK_BUILD if args.quick else BuildConfig()
    root = REPO_ROOT
    work = Path(args.work_dir) if args.work_dir else root / "runs" / ("build-assets-quick" if args.quick else "build-assets")
    command = "python -m tev build-assets" + (" --quick" if args.quick else "")
    from tev.util.paths import assets_dir

    run_build(config, work, Path(args.out) if args.out else assets_dir(), args.quick, args.fresh, command)
