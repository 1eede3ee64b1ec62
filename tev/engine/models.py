"""Loading the target ``p`` and the drafters ``q``: embedded assets, local folders, HF ids.

Rules: ``from_pretrained`` with safetensors only (no pickle) and never ``trust_remote_code``;
offline unless the caller allows downloads; the device is CUDA when present, else CPU; the
dtype is bfloat16 on CUDA and float32 on CPU unless overridden. A target and a drafter must
share a tokenizer: a mismatched pair is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tev.engine.block_drafter import DRAFTER_FILE, BlockDrafter, DrafterBody, read_drafter_config
from tev.engine.drafters import ARTreeDrafter, BlockTreeDrafter, Drafter
from tev.engine.path_drafter import PathDrafter, PathTreeDrafter
from tev.engine.default_target import DefaultTargetError, ensure_default_target
from tev.engine.prompt_text import has_chat_template
from tev.engine.session import max_positions
from tev.engine.target import Target, TargetPrecision
from tev.engine.target_precision import choose_target_forward
from tev.util.paths import models_dir

__all__ = [
    "ModelLoadError",
    "resolve_device",
    "resolve_dtype",
    "load_tokenizer",
    "load_causal_lm",
    "load_block_drafter",
    "load_drafter",
    "check_same_tokenizer",
    "drafter_model_class",
    "tree_drafter_of",
    "DrafterKind",
    "DRAFTERS",
    "DRAFTER_KINDS",
    "offered_kinds",
    "default_kind",
    "Pair",
    "PAIRS",
    "DEFAULT_PAIR",
    "pair_record",
    "default_pair",
    "shipped_drafter",
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
        model = drafter_model_class(read_drafter_config(folder)).from_pretrained(folder, target)
    except ModelLoadError:
        raise
    except (ValueError, OSError, RuntimeError, KeyError) as error:  # named after the file at fault where it can
        message = _first_line(error) if not isinstance(error, (ValueError, FileNotFoundError)) else str(error).splitlines()[0]
        raise ModelLoadError(message if str(folder) in message else f"could not load the block drafter from folder {folder}: {message}") from error
    return tree_drafter_of(model.requires_grad_(False), shape=shape, name=name)  # trainers load their own copy


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
# Everything that differs between pairs is a field of its record, so no other module names a pair.
@dataclass(frozen=True)
class Pair:
    """A shipped target and its drafters.

    Attributes:
        name: how ``--pair``, ``$TEV_PAIR`` and the JSON name it.
        description: one line for the command line's help and the page.
        drafters: drafter kind -> its folder under :attr:`home` (kinds of :data:`DRAFTERS`;
            a derived kind such as ``chain`` needs no folder).
        target_folder: the target's folder under ``models_dir()``, or None when the target is
            converted from its wheel on first use (:mod:`tev.engine.default_target`).
        chat: prompts are user messages through the chat template (else raw text).
        has_domains: its ExitTrain conversations come by domain (dialogue, code, math).
        exittrain_data: the shipped ExitTrain data file under :attr:`home`, or None (the
            data is regenerated by the target from the corpus).
        own_folder: its files (drafters, data, measurements) lie in a folder of its name under
            ``models_dir()`` (:attr:`home`), else at its top.
        default_drafter: the kind the page and ``generate`` start with where the pair ships it
            (else the block drafter, the paper's setting).
    """

    name: str
    description: str
    drafters: dict[str, str] = field(default_factory=dict)
    target_folder: str | None = None
    chat: bool = False
    has_domains: bool = False
    exittrain_data: str | None = None
    own_folder: bool = False
    default_drafter: str = "block"

    @property
    def home(self) -> str:
        """The folder under ``models_dir()`` that holds this pair's own files ("" for the top)."""
        return self.name if self.own_folder else ""

    def target(self) -> Path:
        """The target's folder (converting the default target on first use)."""
        if self.target_folder is not None:
            return models_dir() / self.target_folder
        try:
            return ensure_default_target()
        except DefaultTargetError as error:
            raise ModelLoadError(str(error)) from error

    def drafter_folder(self, kind: str) -> Path:
        """Where this pair keeps its drafter of ``kind`` (present or not); loads nothing."""
        if kind not in self.drafters:
            raise ModelLoadError(f"the {self.name} pair ships no {kind!r} drafter (it ships {', '.join(self.drafters)})")
        return models_dir() / self.home / self.drafters[kind]

    def exittrain_data_path(self) -> Path | None:
        return models_dir() / self.home / self.exittrain_data if self.exittrain_data else None


PAIRS: dict[str, Pair] = {
    pair.name: pair
    for pair in (
        Pair(
            "smollm2",
            "SmolLM2-135M-Instruct with this project's path and block drafters (the default)",
            drafters={"block": "drafter-block", "exittrain": "drafter-exittrain", "path": "drafter-path"},
            chat=True,
            has_domains=True,
            exittrain_data="exittrain-data.safetensors",
            own_folder=True,
            # the path drafter reaches further (tau +16-32%) and, its step fused, is 5-10% faster at T = 0 and the page's law: docs/benchmarks.md
            default_drafter="path",
        ),
        Pair(
            "tiny",
            "the 7M code model and its drafters, trained here on the Python standard library (fast; for tests and a quick look)",
            drafters={"block": "drafter-base", "exittrain": "drafter-exittrain", "ar": "ar-drafter"},
            target_folder="target",
        ),
    )
}
DEFAULT_PAIR = next(iter(PAIRS.values()))  # the first


def pair_record(name: str) -> Pair:
    if name not in PAIRS:
        raise ModelLoadError(f"unknown pair {name!r}; choose one of {', '.join(PAIRS)}")
    return PAIRS[name]


def default_pair() -> str:
    """``$TEV_PAIR`` when set (a name of :data:`PAIRS`), else :data:`DEFAULT_PAIR`'s name."""
    name = os.environ.get("TEV_PAIR") or DEFAULT_PAIR.name
    if name not in PAIRS:
        raise ModelLoadError(f"TEV_PAIR={name!r} is not a shipped pair; choose one of {', '.join(PAIRS)}")
    return name


def shipped_drafter(pair: str, kind: str) -> Path:
    """Where the pair named ``pair`` keeps its drafter of ``kind`` (present or not)."""
    return pair_record(pair).drafter_folder(kind)


# --------------------------------------------------------------------------- the drafter registry
# A drafter folder's config names how its body is read (``conditioning``): the model class that
# runs it, and the tree front end that drafts with it.
DRAFTER_MODELS: dict[str, type[DrafterBody]] = {BlockDrafter.CONDITIONING: BlockDrafter, PathDrafter.CONDITIONING: PathDrafter}


def drafter_model_class(config) -> type[DrafterBody]:
    """The model class that runs a drafter config (by its ``conditioning``; an unknown one is the
    block drafter's, which refuses it by name)."""
    return DRAFTER_MODELS.get(config.conditioning, BlockDrafter)


def tree_drafter_of(model: DrafterBody, shape: str = "tree", name: str | None = None) -> BlockTreeDrafter | PathTreeDrafter:
    """The tree front end of a block or path drafter model."""
    if isinstance(model, PathDrafter):
        return PathTreeDrafter(model, shape=shape, name=name)
    return BlockTreeDrafter(model, shape=shape, name=name or ("block" if shape == "tree" else "chain"))


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter a bundle can offer.

    Attributes:
        label: how the page and the command line's help name it.
        load: ``load(loading)`` -> a :class:`~tev.engine.drafters.Drafter`, or None where the
            pair ships none (``loading``: a :class:`Loading`).
        derived: built from another kind's model (loaded after the others).
    """

    label: str
    load: Callable[["Loading"], Drafter | None]
    derived: bool = False


@dataclass
class Loading:
    """What a drafter loader may read: the target and its tokenizer, the shipped pair (None for a
    target given by folder or id), the loading options, and the drafters loaded so far."""

    target: object
    tokenizer: object
    pair: Pair | None
    device: str | torch.device
    dtype: str | torch.dtype
    drafters: dict


def _shipped_block(kind: str) -> Callable[[Loading], Drafter | None]:
    def load(loading: Loading) -> Drafter | None:
        if loading.pair is None or kind not in loading.pair.drafters:
            return None
        folder = loading.pair.drafter_folder(kind)
        return load_block_drafter(folder, loading.target, name=kind) if (folder / DRAFTER_FILE).is_file() else None

    return load


def _shipped_ar(loading: Loading) -> Drafter | None:
    if loading.pair is None or "ar" not in loading.pair.drafters or not (loading.pair.drafter_folder("ar") / "config.json").is_file():
        return None
    return load_drafter(loading.pair.drafter_folder("ar"), loading.target, loading.tokenizer, device=loading.device, dtype=loading.dtype, name="ar")


def _chain(loading: Loading) -> Drafter | None:
    """The top-1 chain of the block drafter (else of the AR drafter): the classic linear draft."""
    if "block" in loading.drafters:
        return BlockTreeDrafter(loading.drafters["block"].model, shape="chain", name="chain")
    if "ar" in loading.drafters:
        return ARTreeDrafter(loading.drafters["ar"].runner, shape="chain", name="chain")
    return None


# kind -> how it is labelled and loaded: a new kind of drafter is one module implementing
# :class:`~tev.engine.drafters.Drafter` and one line here; the page, the command line, the
# walkthrough and the load test offer it from this registry (in this order).
DRAFTERS: dict[str, DrafterKind] = {
    "block": DrafterKind("block (base)", _shipped_block("block")),
    "exittrain": DrafterKind("block (ExitTrain, shipped with the app)", _shipped_block("exittrain")),
    "path": DrafterKind("path (each depth reads the path above it)", _shipped_block("path")),
    "chain": DrafterKind("chain (top-1)", _chain, derived=True),
    "ar": DrafterKind("AR drafter", _shipped_ar),
}
DRAFTER_KINDS = tuple(DRAFTERS)


def _starting_kind(preferred: tuple[str, ...], present) -> str:
    """The first of ``preferred`` that is ``present``, else ``block``, else the first present kind."""
    return next((kind for kind in (*preferred, "block", *present) if kind in present), "block")


def default_kind(pair: Pair) -> str:
    """The drafter kind a session starts with: the pair's ``default_drafter`` where it ships one,
    else ``block`` (or the first kind it offers)."""
    return _starting_kind((pair.default_drafter,), offered_kinds(pair))


def offered_kinds(pair: Pair) -> list[str]:
    """The drafter kinds ``pair`` can offer, read from its files alone (no model loads): each kind
    whose folder holds a drafter, and the derived kinds (the top-1 chain) when any does."""
    present = [kind for kind in pair.drafters if any((pair.drafter_folder(kind) / name).is_file() for name in (DRAFTER_FILE, "config.json"))]
    return [kind for kind in DRAFTERS if kind in present or (DRAFTERS[kind].derived and present)]


@dataclass
class ModelBundle:
    """A target, its tokenizer and the drafters that can pair with it.

    ``runner`` is the :class:`~tev.engine.target.Target` every session, generation and cost curve on
    the target takes: its model with the forward chosen for it at load; ``target`` is its model.
    ``pair`` names the shipped pair it came from (None for a target given by folder or id);
    ``default_drafter`` the kind a session starts with (the drafter given by path, else the
    pair's default where it ships it, else ``block``).
    """

    runner: Target
    tokenizer: object
    drafters: dict
    target_source: str
    pair: str | None = None
    default_drafter: str = "block"

    @property
    def target(self):
        """The target's transformers model (``runner.model``)."""
        return self.runner.model

    @property
    def precision(self) -> TargetPrecision | None:
        """The target's forward and precision here, and why (``runner.precision``)."""
        return self.runner.precision

    @property
    def context_length(self) -> int:
        return max_positions(self.target)

    @property
    def is_chat(self) -> bool:
        """Whether the target has a chat template (prompts are then user messages by default)."""
        return has_chat_template(self.tokenizer)

    @property
    def shipped(self) -> Pair | None:
        """The shipped pair's record (None for a target given by folder or id)."""
        return PAIRS[self.pair] if self.pair else None

    @property
    def has_domains(self) -> bool:
        """Whether its ExitTrain data comes by domain (a shipped pair's record says)."""
        return self.shipped is not None and self.shipped.has_domains

    def shipped_folder(self, kind: str) -> Path:
        """The shipped pair's folder of drafter ``kind``; a target given by folder or id ships none."""
        if self.shipped is None:
            raise ModelLoadError(f"the {kind!r} drafter comes with a shipped pair (--pair); a target given by folder or id ships no drafters")
        return self.shipped.drafter_folder(kind)

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
    shipped = None  # the pair's record when no target is given
    if target is None:
        shipped = pair_record(pair or default_pair())
        target = shipped.target()
        if not (target / "config.json").is_file():
            raise ModelLoadError(f"the {shipped.name} target is missing from {target}; rebuild it with `python -m tev build-assets`")
    target_source = str(target)
    tokenizer = load_tokenizer(target_source, allow_download)
    model = load_causal_lm(target_source, device=device, dtype=dtype, device_map=device_map, allow_download=allow_download)
    runner = Target(model)
    choose_target_forward(runner)  # checked and timed here: every session on the target runs the choice
    loading = Loading(model, tokenizer, shipped, device, dtype, {})
    for kind, entry in DRAFTERS.items():
        if not entry.derived and (drafter := entry.load(loading)) is not None:
            loading.drafters[kind] = drafter
    if draft is not None:
        extra = load_drafter(draft, model, tokenizer, device=device, dtype=dtype, allow_download=allow_download)
        extra.name = "ar" if isinstance(extra, ARTreeDrafter) else "path" if isinstance(extra, PathTreeDrafter) else "block"
        loading.drafters[extra.name] = extra
    for kind, entry in DRAFTERS.items():
        if entry.derived and (drafter := entry.load(loading)) is not None:
            loading.drafters[kind] = drafter
    drafters = {kind: loading.drafters[kind] for kind in DRAFTERS if kind in loading.drafters}  # the registry's order
    preferred = (extra.name,) if draft is not None else ((shipped.default_drafter,) if shipped else ())
    return ModelBundle(runner, tokenizer, drafters, target_source, shipped.name if shipped else None, _starting_kind(preferred, drafters))
