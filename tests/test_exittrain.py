"""ExitTrain: the loss by hand, tree-attention target quantities, training, checkpoints."""

import dataclasses
import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import tev.train.loop
from tev.bench.ablation import install_from_ablation, run_ablation
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.data.prompts import load_prompt_set
from tev.engine.models import DEFAULT_PAIR, load_bundle, shipped_drafter
from tev.pipelines.card import refresh_card
from tev.train.data import TrainData
from tev.train.experiment import Experiment
from tev.util.compute_thread import result_of
from tev.util.progress import Phase
from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
from tev.train.loop import optimizer_for, schedule_for, train
from tev.train.losses import exit_loss_terms, node_weights
from tev.train.teacher import corpus_sequences, regenerate_sequences
from tev.train.trees import score_trees, target_pass
from tev.util.paths import assets_dir
from tev.util.stored import read_result
from tests.tiny import tiny_block_drafter, tiny_target

VOCAB = 48


def test_loss_on_a_hand_built_tree_equals_hand_computation():
    # root -> a (token 1) -> c (token 2); root -> b (token 3). Vocabulary 4, horizon 2.
    tree = DraftTree.from_paths(0, [[1, 2], [3]])  # nodes: 0 root, 1 a, 2 c, 3 b
    probs = torch.tensor(
        [
            [0.1, 0.5, 0.2, 0.2],  # root: P(a) = 0.5, P(b) = 0.2, rho(root) = 0.3
            [0.25, 0.25, 0.4, 0.1],  # a: P(c) = 0.5 * 0.4 = 0.2, rho(a) = 0.6, w(a) = 0.3
            [0.25, 0.25, 0.25, 0.25],  # c: leaf, w(c) = 0.2
            [0.25, 0.25, 0.25, 0.25],  # b: leaf, w(b) = 0.2
        ],
        dtype=torch.float64,
    )
    flow = target_flow(tree, probs)
    assert flow.exit_weight.tolist() == pytest.approx([0.3, 0.3, 0.2, 0.2])
    assert flow.reach.tolist() == pytest.approx([1.0, 0.5, 0.2, 0.2])
    draft_logits = torch.tensor([[[0.0, 1.0, 0.0, 2.0], [0.5, 0.0, 3.0, 0.0]]], dtype=torch.float64)  # [1, K=2, V=4]
    log_q = torch.log_softmax(draft_logits[0], dim=-1)
    # non-root nodes: a (depth 1, token 1), c (depth 2, token 2), b (depth 1, token 3); |V| - 1 = 3
    expected = {
        "exit": -(0.3 * log_q[0, 1] + 0.2 * log_q[1, 2] + 0.2 * log_q[0, 3]) / 3,
        # prefix: P over non-root = (0.5, 0.2, 0.2), total 0.9, rescaled to the exit total 0.7
        "prefix": -(0.7 / 0.9) * (0.5 * log_q[0, 1] + 0.2 * log_q[1, 2] + 0.2 * log_q[0, 3]) / 3,
        "none": torch.tensor(0.0, dtype=torch.float64),
    }
    example = torch.zeros(3, dtype=torch.long)
    for mode, value in expected.items():
        weights = node_weights(flow.exit_weight, flow.reach, mode)
        assert weights[0] == 0
        loss = exit_loss_terms(draft_logits, example, tree.depths[1:], tree.tokens[1:], weights[1:], total_nodes=3)
        assert loss.item() == pytest.approx(value.item(), abs=1e-12), mode
    exit_total = node_weights(flow.exit_weight, flow.reach, "exit").sum()
    prefix_total = node_weights(flow.exit_weight, flow.reach, "prefix").sum()
    assert prefix_total.item() == pytest.approx(exit_total.item())  # prefix totals equal exit totals


def test_tree_attention_target_quantities_equal_sequential_forwards():
    target = tiny_target(VOCAB, scale=2.0)
    sequence = torch.randint(1, VOCAB, (20,), generator=torch.Generator().manual_seed(0))
    trees = [DraftTree.from_paths(int(sequence[r]), paths) for r, paths in ((9, [[1, 2], [3]]), (14, [[4, 5, 6], [4, 7], [8]]), (19, [[9]]))]
    roots = [9, 14, 19]
    row = target_pass(target, sequence)
    scored = score_trees(row, trees, roots, temperature=1.0)
    for tree, root, reach, exit_weight in zip(trees, roots, scored.reach, scored.exit_weight):
        rows = []
        for v in range(tree.num_nodes):  # p_v by a plain forward over context + path
            ids = torch.cat([sequence[: root + 1], torch.tensor(tree.path_tokens(v), dtype=torch.long)])
            with torch.no_grad():
                rows.append(torch.softmax(target(input_ids=ids[None]).logits[0, -1].double(), dim=-1))
        reference = target_flow(tree, torch.stack(rows))
        assert torch.allclose(reach.double(), reference.reach, atol=1e-5)
        assert torch.allclose(exit_weight.double(), reference.exit_weight, atol=1e-5)
    assert row.session.cache.get_seq_length() == sequence.numel()  # the sequence cache is left as it was


def make_run(steps=20, tree_term="exit", seed=0, **overrides):
    # a peaked target and sampled continuations: what the drafter learns shows up in the T = 1 coverage
    target = tiny_target(VOCAB, scale=10.0)
    drafter = tiny_block_drafter(target, horizon=4).model.float()
    stream = torch.randint(1, VOCAB, (4000,), generator=torch.Generator().manual_seed(1))
    data = TrainData.of(regenerate_sequences(target, stream, 24, 12, 20, seed=2, progress=False, greedy_share=0.0), 12)
    settings = dict(tree_term=tree_term, steps=steps, budget=8, lr=5e-3, warmup=2, sequences_per_step=3, anchors_per_sequence=4, eval_every=0, save_every=0, seed=seed)
    settings = dataclasses.replace(EXITTRAIN_SETTINGS, **{**settings, **overrides})
    return target, drafter, data, settings


def test_training_raises_expected_block_length_and_leaves_the_target_untouched():
    target, drafter, data, settings = make_run(steps=40)
    target_before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    drafter_before = {name: tensor.clone() for name, tensor in drafter.state_dict().items()}
    experiment = Experiment.exittrain(target, drafter, data, data.select(range(8)), settings)
    events = []
    change = result_of(experiment.phases(), events.append)
    assert [event.phase for event in events if event.starts] == [Phase.BEFORE, Phase.TRAIN, Phase.AFTER]
    assert [event.info["step"] for event in events if event.phase is Phase.TRAIN and event.info] == list(range(1, 41))
    assert len(experiment.history) == 40 and all(math.isfinite(r["loss"]) and r["loss_tree"] > 0 for r in experiment.history)
    assert change["after"] > change["before"] + 0.01, change
    assert all(torch.equal(tensor, target_before[name]) for name, tensor in target.state_dict().items())  # bit for bit
    assert all(p.grad is None for p in target.parameters())
    changed = [name for name, tensor in drafter.state_dict().items() if not torch.equal(tensor, drafter_before[name])]
    assert changed  # the drafter did learn


def test_the_first_anchor_roots_at_the_last_prompt_token_so_the_first_round_is_trained():
    # a hand-built sequence: prompt [5, 6, 7], answer [8, 9, 10]; the first decoding round's root is 7
    data = TrainData(torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([6]), torch.tensor([3]), torch.zeros(1, 6, 2))
    assert data.anchors.tolist() == [[0, 1], [0, 2], [0, 3]]  # features up to t, root x_{t+1}
    _, _, root, labels = data.batch(data.anchors, window=2, horizon=2)
    assert root.tolist() == [7, 8, 9]  # the first anchor's root is the last prompt token
    assert labels.tolist() == [[8, 9], [9, 10], [10, -100]]
    # and an on-policy step draws it: one row, every anchor
    target, drafter, _, settings = make_run(steps=1, sequences_per_step=1, anchors_per_sequence=8, tree_term="exit")
    sequence = TrainData(torch.randint(1, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3)), torch.tensor([10]), torch.tensor([6]))
    drawn = sequence.draw(1, 8, torch.Generator().manual_seed(0))
    assert drawn[:, 1].tolist() == [4, 5, 6, 7]  # roots at positions 5 (the last prompt token) .. 8
    record = next(train(drafter, sequence, settings, target=target))
    assert record["loss_tree"] > 0


def test_killed_and_resumed_run_continues_from_its_checkpoint(tmp_path):
    target, drafter, data, settings = make_run(steps=10, save_every=5)
    list(train(drafter, data, settings, target=target))
    _, first, _, _ = make_run(steps=10, save_every=5)
    for record in train(first, data, settings, target=target, checkpoint=tmp_path / "checkpoint"):
        if record["step"] == 5:
            break  # "killed" after the step-5 checkpoint
    _, resumed, _, _ = make_run(steps=10, save_every=5)
    records = list(train(resumed, data, settings, target=target, checkpoint=tmp_path / "checkpoint"))
    assert records[0]["step"] == 6
    for (name, a), b in zip(drafter.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_interrupted_checkpoint_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    target, drafter, data, settings = make_run(steps=4, save_every=2)
    records = train(drafter, data, settings, target=target, checkpoint=tmp_path / "checkpoint")
    next(records), next(records)  # step 2 wrote a checkpoint
    assert (tmp_path / "checkpoint" / "checkpoint.json").is_file()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tev.train.loop, "save_file", crash)
    next(records)
    with pytest.raises(OSError, match="disk full"):
        next(records)  # step 4 tries to write and fails half way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no partial folder visible
    assert json.loads((tmp_path / "checkpoint" / "checkpoint.json").read_text())["step"] == 2


def test_a_checkpoint_swap_killed_between_its_renames_is_recovered(tmp_path):
    target, drafter, data, settings = make_run(steps=2, save_every=2)
    list(train(drafter, data, settings, target=target, checkpoint=tmp_path / "checkpoint"))
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old-12345")  # killed after retiring the old checkpoint
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    (tmp_path / f".checkpoint.new-{finished.pid}").mkdir()  # ... before its new one was complete (the writer is gone)
    _, fresh, _, _ = make_run(steps=2, save_every=2)
    assert list(train(fresh, data, settings, target=target, checkpoint=tmp_path / "checkpoint")) == []  # already at step 2
    assert json.loads((tmp_path / "checkpoint" / "checkpoint.json").read_text())["step"] == 2


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    target, drafter, data, settings = make_run(steps=8, warmup=2)
    rates = [record["lr"] / settings.lr for record in train(drafter, data, settings, target=target)]
    assert rates[:3] == pytest.approx([0.0, 0.5, 1.0])  # linear warm-up over 2 steps
    assert all(a > b for a, b in zip(rates[2:], rates[3:]))  # then cosine decay ...
    optimizer = optimizer_for(drafter, settings)
    assert rates[-1] > 0.1 and schedule_for(optimizer, 2, 8, step=8).get_last_lr()[0] == pytest.approx(0.1 * settings.lr)  # ... to a tenth at the end


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"budget": 0}, "budget must be"),
        ({"lambda_tree": -1.0}, "lambda_tree must be a finite number >= 0"),
        ({"steps": 0}, "steps must be"),
        ({"tree_term": "depth"}, "tree term must be one of"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"lr": float("nan")}, "lr must be a finite number > 0"),
        ({"trees": "sometimes"}, "trees must be one of"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(EXITTRAIN_SETTINGS, **overrides)


def test_missing_data_is_refused():
    with pytest.raises(ValueError, match="training sequences"):
        TrainData.of(torch.zeros(0, 5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="room for an anchor"):
        TrainData.of(torch.zeros(4, 5, dtype=torch.long), 5)  # the whole row is prompt: nothing to label


def test_ablation_trains_each_mode_and_installs_the_measured_exit_drafter(quick_assets_dir, tmp_path, monkeypatch):
    """`bench exittrain --install`: every mode trained from one base; the shipped drafter has
    the evaluated exit drafter's exact weights, with its card entry; other assets untouched."""
    assets = tmp_path / "assets"
    shutil.copytree(quick_assets_dir, assets)
    monkeypatch.setenv("TEV_ASSETS_DIR", str(assets))
    target_bytes = (assets / "models" / "target" / "model.safetensors").read_bytes()
    bundle = load_bundle(dtype="float32")
    config = dataclasses.replace(EXITTRAIN_SETTINGS, steps=2, budget=8, sequences_per_step=2, anchors_per_sequence=2, eval_every=0, save_every=0)
    prompts = load_prompt_set("heldout")[:2]
    train = TrainData.of(corpus_sequences(bundle.target, bundle.tokenizer, "train", 4, 24, 8, seed=7, cache_dir=None, progress=False), 24)
    heldout = TrainData.of(corpus_sequences(bundle.target, bundle.tokenizer, "heldout", 4, 24, 8, seed=8, cache_dir=None, progress=False), 24)
    result = run_ablation(bundle, shipped_drafter("tiny", "block"), train, heldout, prompts, config=config, budgets=(8,), temperatures=(0.0, 1.0), max_new_tokens=6, out=tmp_path / "eval", progress=False)
    assert sorted({row["drafter"] for row in result["rows"]}) == ["base", "exit", "none", "prefix"]
    assert len(result["rows"]) == 4 * 2 and all(math.isfinite(row["tau"]) for row in result["rows"])
    assert set(result["training"]) == {"none", "prefix", "exit"}
    assert all(t["heldout_change"]["before"] == result["base_heldout_tau_bound"] for t in result["training"].values())  # one set of held-out anchors
    for summary in result["heldout_trees"].values():  # the exit law sums to 1 per tree, over depths
        assert sum(summary["internal"]) + sum(summary["leaf"]) == pytest.approx(1.0, abs=1e-6)
    result["command"], result["pair"] = "python -m tev bench exittrain --install", "tiny"  # as the command records them
    install_from_ablation(result, tmp_path / "eval", bundle.target)
    shipped = shipped_drafter("tiny", "exittrain")
    shipped_tensors, measured_tensors = load_file(shipped / "drafter.safetensors"), load_file(tmp_path / "eval" / "drafter-exit" / "drafter.safetensors")
    assert shipped_tensors.keys() == measured_tensors.keys()  # (the header's metadata order is not fixed, so not bytes)
    assert all(torch.equal(shipped_tensors[name], measured_tensors[name]) for name in shipped_tensors)
    entry = json.loads((shipped / "exittrain.json").read_text())
    assert entry["settings"]["tree_term"] == "exit" and "| exit |" in entry["ablation"]
    card = (assets / "README.md").read_text()
    assert "## ExitTrain drafter" in card and "python -m tev bench exittrain --install" in card
    assert (assets / "models" / "target" / "model.safetensors").read_bytes() == target_bytes
    assert not [p.name for p in (assets / "models").iterdir() if p.name.startswith(".")]  # no staging left
    result["pair"] = "smollm2"  # the default pair's drafter goes to its own folder, with its own card section
    install_from_ablation(result, tmp_path / "eval", bundle.target)
    assert (assets / "models" / "smollm2" / "drafter-exittrain" / "exittrain.json").is_file()
    card = (assets / "README.md").read_text()
    assert card.count("## ExitTrain drafter") == 2 and "Where the target's mass leaves each drafter's trees" in card


def test_the_card_renders_from_the_shipped_reports(tmp_path):
    """Every report the card reads, as shipped (rows measured before tau counted tokens per forward among them), renders; each
    pair's ExitTrain section shows its held-out 1 + C before and after and its trees' table."""
    shipped = assets_dir() / "models"
    names = ["build.json", "drafter-exittrain/exittrain.json", f"{DEFAULT_PAIR.home}/drafter-block/training.json",
             f"{DEFAULT_PAIR.home}/drafter-exittrain/exittrain.json", f"{DEFAULT_PAIR.home}/workload-results.json"]
    for name in names:
        (tmp_path / "models" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(shipped / name, tmp_path / "models" / name)
    refresh_card(tmp_path)
    card = (tmp_path / "README.md").read_text()
    for name in names[1:4:2]:
        entry = read_result(shipped / name, "exittrain")
        assert f"{entry['heldout_tau_bound_before']:.3f} before, {entry['heldout_tau_bound_after']:.3f} after" in card
        for drafter, trees in entry.get("heldout_trees", {}).items():
            assert f"| {drafter} | {trees['tau_bound']:.3f} |" in card
    # the shipped rows were measured when "tau" was the mean block length: the card names them so, never as tau
    assert "| mean block length (+- s.e. over rounds) |" in card and "| tau (+- s.e.) |" not in card
    assert "| 0 | 16 | not measured | 2.254 +- 0.038 (s.e. over rounds) |" in card  # the block drafter's training.json, as shipped
    assert "Mean change of mean block length against the base by domain" in card and "K = 4: mean block length 2.895" in card
