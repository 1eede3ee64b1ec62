"""The default target's converted cache: never trusted when damaged or partial, converted once
when two servers start together, and a full disk gives a clear message with nothing left half-written."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time

import pytest
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.tiny import save_chat_target
from tev.engine import default_target
from tev.engine.models import load_causal_lm
from tev.util.files import atomic_folder


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    folder = save_chat_target(tmp_path_factory.mktemp("chat") / "target")
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


@pytest.fixture
def cache(tmp_path, monkeypatch, tiny_chat):
    """A fresh cache whose "conversion" saves the tiny chat model (counted), from a GGUF that passes its check."""
    monkeypatch.setenv("TEV_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / default_target.GGUF_FILE
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(default_target, "gguf_path", lambda fetch=None: gguf)
    monkeypatch.setattr(default_target, "check_gguf", lambda path: None)
    calls = []

    def convert(source, destination, progress=True):
        calls.append(destination)
        time.sleep(0.3)  # long enough for a second server to arrive while this one converts
        default_target.save_converted(*tiny_chat, destination)

    monkeypatch.setattr(default_target, "convert", convert)
    return calls


def _staging_leftovers():
    root = default_target.cache_root()
    return [path.name for path in root.iterdir() if path.name.startswith(".") and path.name != default_target.LOCK]


def test_a_complete_conversion_is_used_as_it_is(cache):
    folder = default_target.ensure_default_target(progress=False)
    marker = json.loads((folder / default_target.MARKER).read_text())
    assert default_target.WEIGHTS in marker["files"] and len(marker["weights_sha256"]) == 64
    assert default_target.ensure_default_target(progress=False) == folder and len(cache) == 1  # not converted again
    load_causal_lm(str(folder), device="cpu")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda folder: (folder / default_target.MARKER).unlink(), "no tev-conversion.json"),
        (lambda folder: (folder / default_target.MARKER).write_text("{not json"), "not valid JSON"),
        (lambda folder: (folder / default_target.WEIGHTS).unlink(), "model.safetensors is missing"),
        (lambda folder: (folder / "config.json").unlink(), "config.json is missing"),
        (lambda folder: _truncate(folder / default_target.WEIGHTS), "bytes, expected"),
        (lambda folder: _flip_a_byte(folder / default_target.WEIGHTS), "does not match its recorded sha256"),
        (lambda folder: _old_marker(folder), "older converter"),
    ],
    ids=["no-marker", "bad-marker", "no-weights", "no-config", "truncated", "flipped-byte", "old-marker"],
)
def test_a_damaged_conversion_is_converted_again_never_trusted(cache, capsys, damage, reason):
    folder = default_target.ensure_default_target(progress=False)
    damage(folder)
    assert reason in default_target._conversion_problem(folder)
    assert default_target.ensure_default_target(progress=True) == folder
    assert len(cache) == 2 and default_target._conversion_problem(folder) is None
    assert "damaged or partial" in capsys.readouterr().out
    assert _staging_leftovers() == []


def test_two_servers_starting_at_once_convert_once(cache):
    results, errors = [], []

    def start():
        try:
            results.append(default_target.ensure_default_target(progress=False))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    servers = [threading.Thread(target=start) for _ in range(3)]
    for server in servers:
        server.start()
    for server in servers:
        server.join()
    assert errors == [] and len(set(results)) == 1 and len(cache) == 1
    assert default_target._conversion_problem(results[0]) is None and _staging_leftovers() == []


FULL_DISK = {  # how the writers report a full disk: the OS's error, and safetensors' own error around it
    "oserror": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "safetensors": lambda: SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
}


@pytest.mark.parametrize("writer", sorted(FULL_DISK))
def test_a_full_disk_while_converting_leaves_nothing_and_says_what_to_do(cache, monkeypatch, tiny_chat, writer):
    model, _ = tiny_chat

    def full(self, folder, **kwargs):
        (folder / "model.safetensors").write_bytes(b"half")  # a partial write before the disk filled
        raise FULL_DISK[writer]()

    with monkeypatch.context() as disk:
        disk.setattr(type(model), "save_pretrained", full)
        with pytest.raises(default_target.DefaultTargetError, match="No space left on device.*free about 300 MB"):
            default_target.ensure_default_target(progress=False)
    assert not default_target.converted_folder().exists() and _staging_leftovers() == []
    folder = default_target.ensure_default_target(progress=False)  # room again: the next start converts
    assert default_target._conversion_problem(folder) is None and len(cache) == 2


def test_a_killed_writers_staging_is_removed_but_a_live_writers_is_kept(tmp_path):
    destination = tmp_path / "converted"
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    dead = tmp_path / f".converted.new-{finished.pid}"
    dead.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = tmp_path / f".converted.new-{live.pid}"
        alive.mkdir()
        with atomic_folder(destination) as staging:
            (staging / "file").write_text("complete")
        assert not dead.exists() and alive.exists()  # another running writer's folder is not pulled from under it
        assert (destination / "file").read_text() == "complete"
    finally:
        live.kill()
        live.wait()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _old_marker(folder):
    marker = folder / default_target.MARKER
    record = json.loads(marker.read_text())
    del record["files"]
    marker.write_text(json.dumps(record))
