"""Self-distillation data and losses: soft labels are the target's own distributions, and
learning from them is learning the same thing as from the written tokens."""

import torch
from transformers import AutoTokenizer

from tev.engine.models import load_causal_lm
from tev.train.data import SoftLabels, TrainData
from tev.train.loop import anchor_token_loss
from tev.train.teacher import target_features, write_responses
from tev.train.trees import draft_logits
from tev.util.precision import low_precision
from tests.tiny import save_chat_target, tiny_target, tiny_vocab_drafter

VOCAB = list(range(0, 300, 2))  # a draft vocabulary of every other token


def _sequences():
    torch.manual_seed(3)
    ids = torch.randint(1, 300, (3, 12))
    lengths = torch.tensor([12, 9, 11])
    return ids, lengths, torch.tensor([4, 3, 5])


def test_soft_labels_are_the_targets_top_distribution_over_the_draft_vocabulary():
    target = tiny_target(300, scale=3.0)
    ids, lengths, _ = _sequences()
    features, soft = target_features(target, ids, lengths, [1, 2], progress=False, soft_vocab=torch.tensor(VOCAB), soft_top=5)
    assert features.shape == (3, 12, 2 * target.config.hidden_size) and soft.positions.shape == (3, 12, 5)
    with torch.no_grad():
        logits = target(input_ids=ids[1:2, :9]).logits[0]  # the second sequence alone, unpadded
    exact = torch.softmax(logits[:, VOCAB], dim=-1)  # renormalised over the draft vocabulary
    top = exact.topk(5, dim=-1)
    assert torch.equal(soft.positions[1, :9].long(), top.indices)
    # a law restricted to the top tokens: renormalised over them
    torch.testing.assert_close(soft.probs[1, :9].float(), top.values / top.values.sum(-1, keepdim=True), atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(soft.probs.float().sum(-1)[lengths[:, None] > torch.arange(12)], torch.ones(int(lengths.sum())), atol=2e-3, rtol=0)
    # without soft labels the features are the same and come alone
    alone = target_features(target, ids, lengths, [1, 2], progress=False)
    assert torch.equal(alone, features)


def test_soft_labels_of_an_anchor_are_shifted_to_the_token_they_predict():
    ids, lengths, prompts = _sequences()
    positions = torch.arange(3 * 12 * 2).reshape(3, 12, 2).to(torch.int16)
    probs = torch.tensor([3.0, 1.0]).expand(3, 12, 2).half()
    data = TrainData(ids, lengths, prompts, torch.zeros(3, 12, 4), SoftLabels(positions, probs))
    got_positions, got_probs = data.soft_labels(torch.tensor([[1, 2]]), horizon=3)
    # labels x_{t+2}, x_{t+3}, x_{t+4} of anchor t = 2: the target's distributions at positions 3, 4, 5
    assert torch.equal(got_positions[0], positions[1, 3:6].long())
    torch.testing.assert_close(got_probs[0], torch.tensor([[0.75, 0.25]] * 3))


def test_one_hot_soft_labels_give_the_token_loss_and_spread_ones_a_higher_one():
    target = tiny_target(300, scale=3.0)
    drafter = tiny_vocab_drafter(target, VOCAB, horizon=3)
    ids, lengths, prompts = _sequences()
    ids = ids - ids % 2  # every written token inside the draft vocabulary
    features = target_features(target, ids, lengths, [1, 2], progress=False)
    one_hot = SoftLabels((ids // 2)[..., None].roll(-1, dims=1).to(torch.int16), torch.ones(3, 12, 1, dtype=torch.float16))
    data = TrainData(ids, lengths, prompts, features, one_hot)
    hard, accuracy = _loss(drafter, data, data.anchors)
    soft, soft_accuracy = _loss(drafter, data, data.anchors, soft=True)
    torch.testing.assert_close(soft, hard)
    assert torch.equal(accuracy, soft_accuracy)  # accuracy is always against the written tokens
    # a label spread over two tokens: the loss is the mixture of the two cross-entropies
    index = data.anchors[:1]
    spread = SoftLabels(torch.stack([one_hot.positions[..., 0], torch.zeros_like(one_hot.positions[..., 0])], -1),
                        torch.tensor([1.0, 1.0]).expand(3, 12, 2).half())
    mixed = TrainData(ids, lengths, prompts, features, spread)
    features_b, valid, root, labels = data.batch(index, 4, 3)
    dtype = low_precision("cpu")  # the training autocast: bfloat16 only where this CPU runs it faster
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        log_q = drafter.draft_logits(features_b, valid, root).float().log_softmax(-1)[0]
    labelled = labels[0] >= 0
    written = drafter.draft_positions(labels[0].clamp(min=0))
    expected = -(0.5 * log_q.gather(-1, written[:, None])[:, 0] + 0.5 * log_q[:, 0])[labelled].mean()
    torch.testing.assert_close(_loss(drafter, mixed, index, soft=True)[0], expected, atol=1e-4, rtol=1e-4)


def test_resumed_responses_equal_an_uninterrupted_run(tmp_path):
    folder = save_chat_target(tmp_path / "chat")
    target = load_causal_lm(folder, device="cpu", dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    requests = [("dialogue", f"request number {i}") for i in range(7)]
    saved = []
    whole = write_responses(target, tokenizer, requests, 6, seed=5, slots=2, progress=False, on_answers=lambda done: saved.append(dict(done)))
    assert [len(s) for s in saved] == [2, 4, 6, 7]  # saved after every 2 answers and at the end
    for partial in saved[:3]:
        resumed = write_responses(target, tokenizer, requests, 6, seed=5, slots=2, progress=False, done=partial)
        assert resumed.sequences == whole.sequences
    assert write_responses(target, tokenizer, requests, 6, seed=5, slots=3, progress=False).sequences == whole.sequences  # one seed per answer


def _loss(drafter, data, index, soft=False):
    """(the training token loss, per-depth accuracy) at anchors ``index``."""
    loss, _, accuracy = anchor_token_loss(drafter, data, index, draft_logits(drafter, data, index), soft)
    return loss, accuracy


def test_the_feature_cache_is_written_in_parts_and_a_stopped_build_redoes_only_the_missing_part(tmp_path, monkeypatch):
    """The cache's parts put together are the one forward's features (stored in bfloat16) and soft
    labels, whatever part a sequence fell in; a part missing is computed again alone, and a
    cache of other data is emptied, not mixed in."""
    import tev.train.feature_cache as feature_cache

    monkeypatch.setattr(feature_cache, "PART_SEQUENCES", 2)
    target = tiny_target(300, scale=3.0)
    ids, lengths, _ = _sequences()
    vocab = torch.tensor(VOCAB)
    features, soft = feature_cache.cached_features(tmp_path / "cache", target, ids, lengths, [1, 2], vocab, 5, progress=False)
    assert features.dtype == torch.bfloat16
    for rows in torch.argsort(lengths, descending=True, stable=True).split(2):  # each part as its own forward, put in place
        width = int(lengths[rows].max())
        part, part_soft = target_features(target, ids[rows, :width], lengths[rows], [1, 2], progress=False, soft_vocab=vocab, soft_top=5, store=torch.bfloat16)
        assert torch.equal(features[rows, :width], part) and torch.equal(soft.positions[rows, :width], part_soft.positions)
        assert torch.equal(soft.probs[rows, :width], part_soft.probs)
    whole = target_features(target, ids, lengths, [1, 2], progress=False, store=torch.bfloat16)  # one forward: other padding, other rounding only
    inside = torch.arange(ids.shape[1])[None] < lengths[:, None]  # padding is never read
    torch.testing.assert_close(features[inside].float(), whole[inside].float(), atol=2e-2, rtol=2e-2)
    assert sorted(p.name for p in (tmp_path / "cache").glob("part-*")) == ["part-0000.safetensors", "part-0001.safetensors"]

    computed = []
    forward = feature_cache.target_features
    monkeypatch.setattr(feature_cache, "target_features", lambda target, ids, *a, **k: computed.append(ids.shape[0]) or forward(target, ids, *a, **k))
    (tmp_path / "cache" / "part-0001.safetensors").unlink()  # the build stopped before its last part
    again, again_soft = feature_cache.cached_features(tmp_path / "cache", target, ids, lengths, [1, 2], vocab, 5, progress=False)
    assert computed == [1] and torch.equal(again, features) and torch.equal(again_soft.probs, soft.probs)
    assert torch.equal(soft.top(2).positions, soft.positions[..., :2])

    other = feature_cache.cached_features(tmp_path / "cache", target, ids[:2], lengths[:2], [1, 2], vocab, 5, progress=False)[0]
    assert computed == [1, 2] and other.shape[0] == 2  # other data: its one part computed afresh
    assert [p.name for p in (tmp_path / "cache").glob("part-*")] == ["part-0000.safetensors"]
