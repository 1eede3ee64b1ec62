"""ExitTrain on conversations: anchor data, padding, the draft vocabulary, soft labels, exit mass
by depth, the paired held-out change, and the default pair's data command."""

import dataclasses
import json
from dataclasses import asdict
import math

import pytest
import torch

from tev.cli import main
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.data.prompts import evaluation_prompts, load_prompt_set, spread_evenly
from safetensors.torch import save_file

from tev.train.data import IGNORE, TrainData, load_train_data, save_train_data
from tev.train.experiment import paired_change
from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
from tev.pipelines.exittrain_data import build_chat_exittrain_data, conversation_data
from tev.train.loop import train
from tev.train.losses import token_losses
from tev.pipelines.train_drafter import QUICK_RECIPE, DrafterRecipe, split_conversations
from tev.train.trees import TreeBatch, on_policy
from tests.tiny import tiny_block_drafter, tiny_target, tiny_vocab_drafter

VOCAB = 48


def _conversations(count: int, seed: int = 0) -> TrainData:
    generator = torch.Generator().manual_seed(seed)
    domains = ["dialogue", "code", "math"]
    ids, starts = [], []
    for i in range(count):
        prompt = int(torch.randint(4, 9, (1,), generator=generator))
        response = int(torch.randint(3, 32, (1,), generator=generator))
        ids.append(torch.randint(1, VOCAB, (prompt + response,), generator=generator).tolist())
        starts.append(prompt)
    return TrainData.from_lists(ids, starts, domains=[domains[i % 3] for i in range(count)], requests=[f"request {i}" for i in range(count)])


def test_conversations_become_training_rows_whose_first_root_is_the_last_prompt_token():
    conversations = _conversations(12)
    data = conversation_data(conversations, max_response_tokens=10, min_anchors=4)
    kept = [i for i, (ids, start) in enumerate(zip(conversations.sequences, conversations.prompt_lengths.tolist())) if min(len(ids) - start, 10) >= 4]
    assert len(data) == len(kept) and data.domains == [conversations.domains[i] for i in kept]
    for row, i in enumerate(kept):
        start, ids = int(conversations.prompt_lengths[i]), conversations.sequences[i]
        length = min(len(ids), start + 10)
        assert int(data.lengths[row]) == length  # cut to the prompt and at most 10 response tokens
        assert data.token_ids[row, :length].tolist() == ids[:length]
        assert int(data.first_anchors[row]) == start - 2  # the first root is the last prompt token, as at decoding
        assert int(data.spans[row]) == length - start  # one anchor per response token
    math_rows = data.domain("math")
    assert set(math_rows.domains) == {"math"} and math_rows.token_ids.shape[1] == int(math_rows.lengths.max())  # trimmed
    with pytest.raises(ValueError, match="no sequences of domain 'poetry'"):
        data.domain("poetry")
    with pytest.raises(ValueError, match="response of 50 tokens"):
        conversation_data(conversations, 60, min_anchors=50)


def test_training_data_round_trips_through_safetensors_and_old_files_still_read(tmp_path):
    data = conversation_data(_conversations(9), 12, 3)
    plain = TrainData.of(torch.randint(0, VOCAB, (3, 20)), 5)
    save_train_data(tmp_path / "d.safetensors", {"train": data, "heldout": plain})
    loaded = load_train_data(tmp_path / "d.safetensors")
    assert torch.equal(loaded["train"].token_ids, data.token_ids) and torch.equal(loaded["train"].prompt_lengths, data.prompt_lengths)
    assert loaded["train"].domains == data.domains and loaded["heldout"].domains is None
    assert plain.spans.tolist() == [15, 15, 15]  # anchors 3 .. 17: root 4 (the last prompt token) .. 18, a label after each
    # files written before the one anchor convention store the last prompt position ("first_anchors")
    save_file({"train.ids": data.token_ids.int(), "train.lengths": data.lengths.int(), "train.first_anchors": (data.prompt_lengths - 1).int()}, tmp_path / "old.safetensors")
    assert torch.equal(load_train_data(tmp_path / "old.safetensors")["train"].prompt_lengths, data.prompt_lengths)
    save_file({"train": plain.token_ids.short(), "heldout": plain.token_ids.short(), "first_anchor": torch.tensor([4])}, tmp_path / "tiny.safetensors")
    assert load_train_data(tmp_path / "tiny.safetensors")["heldout"].prompt_lengths.tolist() == [5, 5, 5]


def test_bad_training_data_is_refused():
    with pytest.raises(ValueError, match="room for an anchor"):
        TrainData.of(torch.zeros(4, 5, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="no training sequences"):
        TrainData.of(torch.zeros(0, 5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="room for an anchor"):
        TrainData(torch.zeros(2, 6, dtype=torch.long), torch.tensor([6, 3]), torch.tensor([2, 3]))  # row 1 is all prompt


def _round(data: TrainData, drafter, soft_top: int = 16):
    """One on-policy round of 4 rows x 3 anchors: (the drawn rows with features, anchors, logits, trees)."""
    target = tiny_target(VOCAB, scale=10.0)
    index = data.draw(4, 3, torch.Generator().manual_seed(0))
    return target, index, on_policy(target, drafter(target), data, index, budget=8, temperature=1.0, soft_top=soft_top)


def test_padding_never_reaches_a_tree_a_label_or_a_loss():
    data = conversation_data(_conversations(8, seed=1), 16, 3)
    other = TrainData(data.token_ids.clone(), data.lengths, data.prompt_lengths, domains=data.domains)
    for row, length in enumerate(data.lengths.tolist()):
        other.token_ids[row, length:] = 7  # different padding, same conversations
    rounds = []
    for rows_data in (data, other):
        _, index, (part, local, logits, scored) = _round(rows_data, lambda t: tiny_block_drafter(t, horizon=4).model)
        rows, anchors = index[:, 0], index[:, 1]
        assert bool(((anchors >= rows_data.first_anchors[rows]) & (anchors <= rows_data.lengths[rows] - 3)).all())  # inside its own response
        labels = part.batch(local, 4, 4)[3]
        rounds.append((labels, part.soft_labels(local, 4), scored, local, part))
    (labels_a, soft_a, scored_a, local, part), (labels_b, soft_b, scored_b, _, _) = rounds
    assert torch.equal(labels_a, labels_b) and torch.equal(soft_a[0], soft_b[0]) and torch.allclose(soft_a[1], soft_b[1])
    assert scored_a.coverage == pytest.approx(scored_b.coverage, abs=1e-6)
    positions = local[:, 1:] + 2 + torch.arange(4)  # label positions, [M, K]
    past = positions >= part.lengths[local[:, 0], None]
    assert bool(((labels_a == IGNORE) == past).all())  # past its end a row is unlabelled
    labelled = soft_a[1][~past]  # the target's top 16 at each labelled depth, renormalised
    assert bool(((labelled > 0).sum(-1) <= 16).all()) and torch.allclose(labelled.sum(-1), torch.ones(len(labelled)))


def test_a_draft_vocabulary_drafter_trains_on_its_own_positions():
    vocab = list(range(0, VOCAB, 2))  # the even tokens only
    data = conversation_data(_conversations(8, seed=2), 16, 3)
    target, index, (part, local, logits, scored) = _round(data, lambda t: tiny_vocab_drafter(t, vocab, horizon=4).float(), soft_top=0)
    assert logits.shape[-1] == len(vocab)  # never the whole vocabulary
    assert all(int(t) % 2 == 0 for tree in scored.trees for t in tree.tokens[1:])  # trees propose draft tokens only
    drafter = tiny_vocab_drafter(target, vocab, horizon=4).float()
    written = part.batch(local, 4, 4)[3]
    expected = torch.where((written != IGNORE) & (written % 2 == 0), written // 2, torch.full_like(written, IGNORE))
    assert torch.equal(drafter.draft_positions(written, missing=IGNORE), expected)  # a token outside the draft vocabulary is unlabelled
    settings = dataclasses.replace(EXITTRAIN_SETTINGS, steps=3, budget=8, sequences_per_step=4, anchors_per_sequence=3, soft_top=0, eval_every=0, save_every=0)
    records = list(train(drafter, data, settings, target=target))
    assert len(records) == 3 and all(math.isfinite(r["loss"]) for r in records)


def test_soft_token_loss_is_the_token_loss_for_one_hot_labels_and_mixes_linearly():
    log_q = torch.log_softmax(torch.randn(3, 2, 5, dtype=torch.float64), -1)
    labels = torch.tensor([[1, 4], [0, IGNORE], [2, 3]])
    one_hot = (labels.clamp(min=0)[..., None], torch.ones(3, 2, 1, dtype=torch.float64))
    hard, soft, _ = token_losses(log_q, labels, one_hot)
    assert soft.item() == pytest.approx(hard.item(), abs=1e-12)
    mixture = (torch.tensor([[[1, 3]]]), torch.tensor([[[0.25, 0.75]]], dtype=torch.float64))
    _, mixed, _ = token_losses(log_q[:1, :1], labels[:1, :1], mixture)
    assert mixed.item() == pytest.approx(-(0.25 * log_q[0, 0, 1] + 0.75 * log_q[0, 0, 3]).item(), abs=1e-12)


def test_exit_mass_by_depth_splits_the_exit_law_into_missing_mass_and_leaves():
    tree = DraftTree.from_paths(0, [[1, 2], [3]])  # root -> a -> c; root -> b
    probs = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.25, 0.25, 0.4, 0.1], [0.25] * 4, [0.25] * 4], dtype=torch.float64)
    flow = target_flow(tree, probs)  # w = (0.3, 0.3, 0.2, 0.2): root and a internal, c and b leaves
    batch = TreeBatch([tree, tree], [flow.reach] * 2, [flow.exit_weight] * 2, [flow.coverage] * 2)
    mass = batch.exit_mass_by_depth(horizon=3)
    assert mass["internal"] == pytest.approx([0.3, 0.3, 0.0, 0.0])
    assert mass["leaf"] == pytest.approx([0.0, 0.2, 0.2, 0.0])


def test_the_live_change_is_paired_over_the_same_anchors():
    tree = DraftTree.from_paths(0, [[1]])

    def batch(coverages):
        return TreeBatch([tree] * len(coverages), [torch.ones(2)] * len(coverages), [torch.ones(2)] * len(coverages), list(coverages))

    change = paired_change(batch([0.5, 1.0, 1.5, 1.0]), batch([0.6, 1.1, 1.6, 1.1]))
    assert change["before"] == pytest.approx(2.0) and change["after"] == pytest.approx(2.1)
    assert change["change"] == pytest.approx(0.05) and change["change_se"] == pytest.approx(0.0, abs=1e-12)  # every anchor gained 0.1
    noisy = paired_change(batch([1.0, 1.0]), batch([1.2, 1.0]))
    assert noisy["change_se"] == pytest.approx(0.1 / 2)  # sd of (0.2, 0) / sqrt(2), over the mean before (2)
    with pytest.raises(ValueError, match="same held-out anchors"):
        paired_change(batch([1.0]), batch([1.0, 2.0]))


def test_chat_evaluation_prompts_take_each_domain_in_turn():
    prompts = evaluation_prompts(chat=True, count=6)
    assert [p["domain"] for p in prompts] == ["dialogue", "code", "math"] * 2
    assert {p["domain"] for p in evaluation_prompts(chat=True, count=3, domain="code")} == {"code"}
    assert len(evaluation_prompts(chat=False, count=4)) == 4


def test_the_data_command_keeps_the_drafter_split_and_caps_each_domain(tmp_path):
    work = tmp_path / "work"
    recipe = {**asdict(QUICK_RECIPE), "shards": 2, "heldout_requests": 5}
    (work / "shard-000").mkdir(parents=True)
    (work / "shard-001").mkdir()
    (work / "recipe.json").write_text(json.dumps(recipe))
    first, second = _conversations(20, seed=4), _conversations(20, seed=5)
    (work / "shard-000" / "conversations.json").write_text(json.dumps(first.to_json()))
    (work / "shard-001" / "conversations.json").write_text(json.dumps(second.to_json()))
    out = tmp_path / "data.safetensors"
    assert main(["exittrain-data", "--work-dir", str(work), "--per-domain", "3", "--response-tokens", "16", "--out", str(out)]) == 0
    parts = load_train_data(out)
    assert {d: parts["train"].domains.count(d) for d in ("dialogue", "code", "math")} == {"dialogue": 3, "code": 3, "math": 3}
    everything = TrainData.concat([first, second])
    _, heldout = split_conversations(everything, DrafterRecipe.from_json(recipe))
    heldout_rows = {tuple(ids[: start + 16]) for ids, start in zip(heldout.sequences, heldout.prompt_lengths.tolist()) if min(len(ids) - start, 16) >= 16}
    train_rows = {tuple(row[:length].tolist()) for row, length in zip(parts["train"].token_ids, parts["train"].lengths)}
    assert not heldout_rows & train_rows  # no held-out conversation is trained on
    assert build_chat_exittrain_data(work, 3, 16)["train"].token_ids.shape == parts["train"].token_ids.shape
    assert main(["exittrain-data", "--work-dir", str(tmp_path / "nowhere")]) == 2  # one line naming the command to run first


def test_benchmark_prompts_give_each_domain_its_share():
    chat = load_prompt_set("chat")  # kept in domain blocks
    for count in (3, 6, 9, 12):
        domains = [p["domain"] for p in spread_evenly(chat, count)]
        assert all(domains.count(d) == count // 3 for d in ("dialogue", "code", "math")), (count, domains)
    assert spread_evenly(chat, 100) == chat and spread_evenly(chat, 0) == []


def test_a_recipe_reads_back_and_one_written_before_it_held_its_train_settings_reads_the_same():
    assert DrafterRecipe.from_json(json.loads(json.dumps(asdict(QUICK_RECIPE)))) == QUICK_RECIPE
    old = asdict(QUICK_RECIPE)
    train = old.pop("train")
    old.update({name: train[name] for name in ("steps", "batch", "lr", "warmup", "short_history_share", "save_every", "eval_every", "soft_top")})
    assert DrafterRecipe.from_json(old) == QUICK_RECIPE
