"""ExitTrain on conversations: anchor data, padding, the draft vocabulary, soft labels, exit mass
by depth, the paired held-out change, and the default pair's data command."""

import json
from dataclasses import asdict
import math

import pytest
import torch
import torch.nn.functional as F

from tev.cli import main
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.data.prompts import evaluation_prompts, load_prompt_set, spread_evenly
from tev.service.live_exittrain import coverage_change
from tev.train.anchor_data import AnchorData, anchor_data_from_conversations, load_anchor_data, save_anchor_data
from tev.train.chat_data import ChatSequences
from tev.train.exit_loss import IGNORE, TreeBatch, soft_token_loss, token_loss
from tev.train.exittrain_data import build_chat_exittrain_data
from tev.train.train_drafter import QUICK_RECIPE, split_conversations
from tev.train.trainer import ExitTrainConfig, ExitTrainer
from tests.tiny import tiny_block_drafter, tiny_target, tiny_vocab_drafter

VOCAB = 48


def _conversations(count: int, seed: int = 0) -> ChatSequences:
    generator = torch.Generator().manual_seed(seed)
    domains = ["dialogue", "code", "math"]
    ids, starts = [], []
    for i in range(count):
        prompt = int(torch.randint(4, 9, (1,), generator=generator))
        response = int(torch.randint(3, 32, (1,), generator=generator))
        ids.append(torch.randint(1, VOCAB, (prompt + response,), generator=generator).tolist())
        starts.append(prompt)
    return ChatSequences(ids, starts, [domains[i % 3] for i in range(count)], [f"request {i}" for i in range(count)])


def test_conversations_become_anchor_rows_that_start_at_the_response():
    conversations = _conversations(12)
    data = anchor_data_from_conversations(conversations, pad_id=0, max_response_tokens=10, min_anchors=4)
    kept = [i for i, (ids, start) in enumerate(zip(conversations.token_ids, conversations.prompt_lengths)) if min(len(ids) - start, 10) >= 4]
    assert len(data) == len(kept) and data.domains == [conversations.domains[i] for i in kept]
    for row, i in enumerate(kept):
        start, ids = conversations.prompt_lengths[i], conversations.token_ids[i]
        length = min(len(ids), start + 10)
        assert int(data.lengths[row]) == length  # cut to the prompt and at most 10 response tokens
        assert data.ids[row, :length].tolist() == ids[:length]
        assert int(data.first_anchors[row]) == start - 1  # the first root is the first response token
        assert int(data.spans[row]) == length - start
    math_rows = data.domain("math")
    assert set(math_rows.domains) == {"math"} and math_rows.ids.shape[1] == int(math_rows.lengths.max())  # trimmed
    with pytest.raises(ValueError, match="no sequences of domain 'poetry'"):
        data.domain("poetry")
    with pytest.raises(ValueError, match="response of 50 tokens"):
        anchor_data_from_conversations(conversations, 0, 60, min_anchors=50)


def test_anchor_data_round_trips_through_safetensors(tmp_path):
    data = anchor_data_from_conversations(_conversations(9), 0, 12, 3)
    plain = AnchorData.of(torch.randint(0, VOCAB, (3, 20)), first_anchor=5)
    save_anchor_data(tmp_path / "d.safetensors", {"train": data, "heldout": plain})
    loaded = load_anchor_data(tmp_path / "d.safetensors")
    assert torch.equal(loaded["train"].ids, data.ids) and torch.equal(loaded["train"].first_anchors, data.first_anchors)
    assert loaded["train"].domains == data.domains and loaded["heldout"].domains is None
    assert plain.spans.tolist() == [14, 14, 14]  # anchors 5 .. 18: a root must follow the last


def test_bad_anchor_data_is_refused():
    with pytest.raises(ValueError, match="room for anchors"):
        AnchorData.of(torch.zeros(4, 5, dtype=torch.long), first_anchor=4)
    with pytest.raises(ValueError, match="no training sequences"):
        AnchorData.of(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="room for an anchor"):
        AnchorData(torch.zeros(2, 6, dtype=torch.long), torch.tensor([6, 3]), torch.tensor([1, 2]))


def _padded_trainer(data: AnchorData, drafter, **overrides) -> ExitTrainer:
    target = tiny_target(VOCAB, scale=10.0)
    settings = dict(steps=3, budget=8, sequences_per_step=4, anchors_per_sequence=3, eval_every=0, save_every=0, seed=3)
    return ExitTrainer(ExitTrainConfig(**{**settings, **overrides}), target, drafter(target), data, heldout=data)


def test_padding_never_reaches_a_tree_a_label_or_a_loss():
    data = anchor_data_from_conversations(_conversations(8, seed=1), 0, 16, 3)
    other = AnchorData(data.ids.clone(), data.lengths, data.first_anchors, data.domains)
    for row, length in enumerate(data.lengths.tolist()):
        other.ids[row, length:] = 7  # different padding, same conversations
    batches = []
    for anchors_data in (data, other):
        trainer = _padded_trainer(anchors_data, lambda t: tiny_block_drafter(t, horizon=4).model)
        rows, anchors = trainer._sample(anchors_data, torch.Generator().manual_seed(0))
        first, last = anchors_data.first_anchors[rows, None], anchors_data.lengths[rows, None] - 2
        assert bool(((anchors >= first) & (anchors <= last)).all())  # every anchor inside its own response
        batches.append(trainer._forward_batch(anchors_data, rows, anchors, train=False))
    a, b = batches
    assert torch.equal(a.labels, b.labels) and torch.allclose(a.soft_labels, b.soft_labels)
    assert a.scored.coverage == pytest.approx(b.scored.coverage, abs=1e-6)
    positions = (anchors[..., None] + 2 + torch.arange(4)).flatten(0, 1)  # label positions, [M, K]
    lengths = data.lengths[rows].repeat_interleave(anchors.shape[1])[:, None]
    assert bool(((a.labels == IGNORE) == (positions >= lengths)).all())  # past its end a row is unlabelled
    assert bool((a.soft_labels.sum(-1)[positions >= lengths] == 0).all())
    labelled = a.soft_labels[positions < lengths]  # the target's top 16, renormalised
    assert bool(((labelled > 0).sum(-1) <= 16).all()) and torch.allclose(labelled.sum(-1), torch.ones(len(labelled)))


def test_a_draft_vocabulary_drafter_trains_on_its_own_positions():
    vocab = list(range(0, VOCAB, 2))  # the even tokens only
    data = anchor_data_from_conversations(_conversations(8, seed=2), 0, 16, 3)
    trainer = _padded_trainer(data, lambda t: tiny_vocab_drafter(t, vocab, horizon=4).float(), token_labels="written")
    rows, anchors = trainer._sample(data, torch.Generator().manual_seed(0))
    batch = trainer._forward_batch(data, rows, anchors, train=True)
    assert batch.draft_logits.shape[-1] == len(vocab)  # never the whole vocabulary
    assert all(int(t) % 2 == 0 for tree in batch.scored.trees for t in tree.tokens[1:])  # trees propose draft tokens only
    positions = (anchors[..., None] + 2 + torch.arange(4)).clamp(max=data.ids.shape[1] - 1)
    written = data.ids[rows][:, None, :].expand(-1, anchors.shape[1], -1).gather(2, positions).flatten(0, 1)
    inside = positions.flatten(0, 1) < data.lengths[rows].repeat_interleave(anchors.shape[1])[:, None]
    expected = torch.where(inside & (written % 2 == 0), written // 2, torch.full_like(written, IGNORE))
    assert torch.equal(batch.labels, expected)  # draft positions; a token outside the draft vocabulary is unlabelled
    events = list(trainer.run())
    assert len(events) == 3 and all(math.isfinite(e.loss) for e in events)


def test_soft_token_loss_is_the_token_loss_for_one_hot_labels_and_mixes_linearly():
    logits = torch.randn(3, 2, 5, dtype=torch.float64)
    labels = torch.tensor([[1, 4], [0, IGNORE], [2, 3]])
    one_hot = F.one_hot(labels.clamp(min=0), 5).double() * (labels != IGNORE)[..., None]
    assert soft_token_loss(logits, one_hot).item() == pytest.approx(token_loss(logits, labels).item(), abs=1e-12)
    mixture = torch.zeros(1, 1, 5, dtype=torch.float64)
    mixture[0, 0, 1], mixture[0, 0, 3] = 0.25, 0.75
    log_q = torch.log_softmax(logits[:1, :1], -1)[0, 0]
    assert soft_token_loss(logits[:1, :1], mixture).item() == pytest.approx(-(0.25 * log_q[1] + 0.75 * log_q[3]).item(), abs=1e-12)


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

    change = coverage_change(batch([0.5, 1.0, 1.5, 1.0]), batch([0.6, 1.1, 1.6, 1.1]))
    assert change["before"] == pytest.approx(2.0) and change["after"] == pytest.approx(2.1)
    assert change["change"] == pytest.approx(0.05) and change["change_se"] == pytest.approx(0.0, abs=1e-12)  # every anchor gained 0.1
    noisy = coverage_change(batch([1.0, 1.0]), batch([1.2, 1.0]))
    assert noisy["change_se"] == pytest.approx(0.1 / 2)  # sd of (0.2, 0) / sqrt(2), over the mean before (2)
    with pytest.raises(ValueError, match="same held-out anchors"):
        coverage_change(batch([1.0]), batch([1.0, 2.0]))


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
    parts = load_anchor_data(out)
    assert {d: parts["train"].domains.count(d) for d in ("dialogue", "code", "math")} == {"dialogue": 3, "code": 3, "math": 3}
    everything = ChatSequences.concat([first, second])
    _, heldout = split_conversations(everything, type(QUICK_RECIPE)(**recipe))
    heldout_rows = {tuple(ids[: start + 16]) for ids, start in zip(heldout.token_ids, heldout.prompt_lengths) if min(len(ids) - start, 16) >= 16}
    train_rows = {tuple(row[:length].tolist()) for row, length in zip(parts["train"].ids, parts["train"].lengths)}
    assert not heldout_rows & train_rows  # no held-out conversation is trained on
    assert build_chat_exittrain_data(work, 3, 16)["train"].ids.shape == parts["train"].ids.shape
    assert main(["exittrain-data", "--work-dir", str(tmp_path / "nowhere")]) == 2  # one line naming the command to run first


def test_benchmark_prompts_give_each_domain_its_share():
    chat = load_prompt_set("chat")  # kept in domain blocks
    for count in (3, 6, 9, 12):
        domains = [p["domain"] for p in spread_evenly(chat, count)]
        assert all(domains.count(d) == count // 3 for d in ("dialogue", "code", "math")), (count, domains)
    assert spread_evenly(chat, 100) == chat and spread_evenly(chat, 0) == []
