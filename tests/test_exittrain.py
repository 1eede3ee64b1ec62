"""ExitTrain: the loss by hand, tree-attention target quantities, training, checkpoints."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

import tev.train.trainer
from tev.bench.ablation import install_from_ablation, run_ablation
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.data.prompts import load_prompt_set
from tev.engine.models import load_bundle, shipped_drafter
from tev.train.distill import regenerate_sequences
from tev.train.exit_loss import exit_loss_terms, node_weights, score_trees
from tev.train.anchor_data import AnchorData
from tev.train.exittrain_command import training_sequences
from tev.train.trainer import ExitTrainConfig, ExitTrainer
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
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        logits = target(input_ids=sequence[None], cache=cache, use_cache=True).logits[0].float()
    scored = score_trees(target, sequence, cache, logits[roots], trees, roots, temperature=1.0)
    for tree, root, reach, exit_weight in zip(trees, roots, scored.reach, scored.exit_weight):
        rows = []
        for v in range(tree.num_nodes):  # p_v by a plain forward over context + path
            ids = torch.cat([sequence[: root + 1], torch.tensor(tree.path_tokens(v), dtype=torch.long)])
            with torch.no_grad():
                rows.append(torch.softmax(target(input_ids=ids[None]).logits[0, -1].double(), dim=-1))
        reference = target_flow(tree, torch.stack(rows))
        assert torch.allclose(reach.double(), reference.reach, atol=1e-5)
        assert torch.allclose(exit_weight.double(), reference.exit_weight, atol=1e-5)
    assert cache.get_seq_length() == sequence.numel()  # the sequence cache is left as it was


def make_trainer(steps=20, weights="exit", seed=0, **overrides):
    # a peaked target and sampled continuations: what the drafter learns shows up in the T = 1 coverage
    target = tiny_target(VOCAB, scale=10.0)
    drafter = tiny_block_drafter(target, horizon=4)
    stream = torch.randint(1, VOCAB, (4000,), generator=torch.Generator().manual_seed(1))
    sequences = regenerate_sequences(target, stream, 24, 12, 20, seed=2, progress=False, greedy_share=0.0)
    settings = dict(weights=weights, steps=steps, budget=8, lr=5e-3, warmup=2, sequences_per_step=3, anchors_per_sequence=4, eval_every=0, save_every=0, seed=seed)
    config = ExitTrainConfig(**{**settings, **overrides})
    return target, ExitTrainer(config, target, drafter.model, sequences, heldout=sequences[:8], first_anchor=11)


def test_training_raises_expected_block_length_and_leaves_the_target_untouched():
    target, trainer = make_trainer(steps=40)
    target_before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    drafter_before = {name: tensor.clone() for name, tensor in trainer.raw_drafter.state_dict().items()}
    before = trainer.heldout_expected_tau()
    events = list(trainer.run())
    after = trainer.heldout_expected_tau()
    assert len(events) == 40 and all(math.isfinite(e.loss) and e.loss_exit > 0 for e in events)
    assert after > before + 0.01, (before, after)
    assert all(torch.equal(tensor, target_before[name]) for name, tensor in target.state_dict().items())  # bit for bit
    assert all(p.grad is None for p in target.parameters())
    changed = [name for name, tensor in trainer.raw_drafter.state_dict().items() if not torch.equal(tensor, drafter_before[name])]
    assert changed  # the drafter did learn


def test_killed_and_resumed_run_continues_from_its_checkpoint(tmp_path):
    _, uninterrupted = make_trainer(steps=10)
    list(uninterrupted.run())
    _, first = make_trainer(steps=10, save_every=5)
    for event in first.run(tmp_path):
        if event.step == 5:
            break  # "killed" after the step-5 checkpoint
    _, resumed = make_trainer(steps=10, save_every=5)
    assert resumed.load_checkpoint(tmp_path) and resumed.step == 5
    list(resumed.run(tmp_path))
    for (name, a), b in zip(uninterrupted.raw_drafter.state_dict().items(), resumed.raw_drafter.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_interrupted_checkpoint_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    _, trainer = make_trainer(steps=4, save_every=2)
    events = trainer.run(tmp_path)
    next(events), next(events)  # step 2 wrote a checkpoint
    assert (tmp_path / "checkpoint" / "trainer_state.json").is_file()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tev.train.trainer, "save_file", crash)
    next(events)
    with pytest.raises(OSError, match="disk full"):
        next(events)  # step 4 tries to write and fails half way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no partial folder visible
    _, fresh = make_trainer(steps=4)
    assert fresh.load_checkpoint(tmp_path) and fresh.step == 2


def test_a_checkpoint_swap_killed_between_its_renames_is_recovered(tmp_path):
    _, trainer = make_trainer(steps=2, save_every=2)
    list(trainer.run(tmp_path))
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old-12345")  # killed after retiring the old checkpoint
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    (tmp_path / f".checkpoint.new-{finished.pid}").mkdir()  # ... before its new one was complete (the writer is gone)
    _, fresh = make_trainer(steps=2, save_every=2)
    assert fresh.load_checkpoint(tmp_path) and fresh.step == 2
    fresh.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    _, trainer = make_trainer(steps=8, warmup=2)
    rates = [event.lr / trainer.config.lr for event in trainer.run()]
    assert rates[:3] == pytest.approx([0.0, 0.5, 1.0])  # linear warm-up over 2 steps
    assert all(a > b for a, b in zip(rates[2:], rates[3:]))  # then cosine decay ...
    assert rates[-1] > 0.1 and trainer.scheduler.get_last_lr()[0] == pytest.approx(0.1 * trainer.config.lr)  # ... to a tenth at the end


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"budget": 0}, "budget must be"),
        ({"lambda_exit": -1.0}, "lambda_exit must be"),
        ({"steps": 0}, "steps must be"),
        ({"weights": "depth"}, "weights must be one of"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"lr": float("nan")}, "lr must be"),
    ],
)
def test_bad_config_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        ExitTrainConfig(**overrides)


def test_missing_data_is_refused():
    target = tiny_target(VOCAB)
    drafter = tiny_block_drafter(target)
    with pytest.raises(ValueError, match="training sequences"):
        ExitTrainer(ExitTrainConfig(), target, drafter.model, torch.zeros(0, dtype=torch.long), first_anchor=0)
    with pytest.raises(ValueError, match="room for anchors"):
        ExitTrainer(ExitTrainConfig(), target, drafter.model, torch.zeros(4, 5, dtype=torch.long), first_anchor=4)


def test_ablation_trains_each_mode_and_installs_the_measured_exit_drafter(quick_assets_dir, tmp_path, monkeypatch):
    """`bench exittrain --install`: every mode trained from one base; the shipped drafter has
    the evaluated exit drafter's exact weights, with its card entry; other assets untouched."""
    assets = tmp_path / "assets"
    shutil.copytree(quick_assets_dir, assets)
    monkeypatch.setenv("TEV_ASSETS_DIR", str(assets))
    target_bytes = (assets / "models" / "target" / "model.safetensors").read_bytes()
    bundle = load_bundle(dtype="float32")
    config = ExitTrainConfig(steps=2, budget=8, sequences_per_step=2, anchors_per_sequence=2, eval_every=0, save_every=0)
    prompts = load_prompt_set("heldout")[:2]
    train = AnchorData.of(training_sequences(bundle.target, bundle.tokenizer, "train", 4, 24, 8, seed=7, cache_dir=None, progress=False), 23)
    heldout = AnchorData.of(training_sequences(bundle.target, bundle.tokenizer, "heldout", 4, 24, 8, seed=8, cache_dir=None, progress=False), 23)
    result = run_ablation(bundle, shipped_drafter("tiny", "block"), train, heldout, prompts, config=config, budgets=(8,), temperatures=(0.0, 1.0), max_new_tokens=6, out=tmp_path / "eval", progress=False)
    assert sorted({row["drafter"] for row in result["rows"]}) == ["base", "exit", "none", "prefix"]
    assert len(result["rows"]) == 4 * 2 and all(row["tau"] >= 1 for row in result["rows"])
    assert set(result["training"]) == {"none", "prefix", "exit"} and result["base_heldout_expected_tau"] >= 1
    for summary in result["heldout_trees"].values():  # the exit law sums to 1 per tree, over depths
        assert sum(summary["internal"]) + sum(summary["leaf"]) == pytest.approx(1.0, abs=1e-6)
    result["command"] = "python -m tev bench exittrain --install"
    install_from_ablation(result, tmp_path / "eval", bundle.target)
    shipped = shipped_drafter("tiny", "exittrain")
    shipped_tensors, measured_tensors = load_file(shipped / "drafter.safetensors"), load_file(tmp_path / "eval" / "drafter-exit" / "drafter.safetensors")
    assert shipped_tensors.keys() == measured_tensors.keys()  # (the header's metadata order is not fixed, so not bytes)
    assert all(torch.equal(shipped_tensors[name], measured_tensors[name]) for name in shipped_tensors)
    entry = json.loads((shipped / "exittrain.json").read_text())
    assert entry["config"]["weights"] == "exit" and "| exit |" in entry["ablation"]
    card = (assets / "README.md").read_text()
    assert "## ExitTrain drafter" in card and "python -m tev bench exittrain --install" in card
    assert (assets / "models" / "target" / "model.safetensors").read_bytes() == target_bytes
    assert not [p.name for p in (assets / "models").iterdir() if p.name.startswith(".")]  # no staging left
    result["pair"] = "smollm2"  # the default pair's drafter goes to its own folder, with its own card section
    install_from_ablation(result, tmp_path / "eval", bundle.target)
    assert (assets / "models" / "smollm2" / "drafter-exittrain" / "exittrain.json").is_file()
    card = (assets / "README.md").read_text()
    assert card.count("## ExitTrain drafter") == 2 and "Where the target's mass leaves each drafter's trees" in card
