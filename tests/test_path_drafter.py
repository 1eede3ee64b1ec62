"""The path-conditioned drafter: its depth-by-depth tree equals its teacher-forced pass, its trees
are the best nodes it scored, it trains through the one loop and loads from its folder."""

import pytest
import torch

from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import DraftContext
from tev.engine.models import ModelLoadError, load_block_drafter
from tev.engine.path_drafter import PathDrafter, PathTreeDrafter
from tev.train.data import TrainData
from tev.train.loop import TrainSettings, heldout_loss, train
from tev.util.int8_head import INT8_ENV
from tests.tiny import tiny_block_drafter, tiny_target

VOCAB = 48


@pytest.fixture(scope="module")
def target():
    return tiny_target(VOCAB, scale=3.0)


def test_each_depth_grown_from_the_cache_equals_the_teacher_forced_pass(target, monkeypatch):
    monkeypatch.setenv(INT8_ENV, "0")  # exact float products on both sides: int8 activations are scaled per call
    model: PathDrafter = tiny_block_drafter(target, conditioning="path").model
    features = torch.randn(6, model.config.feature_size)
    window, valid = model.window(features)
    with torch.no_grad():
        forced = model.draft_logits(window, valid, torch.tensor([5]), torch.tensor([[3, 7, 9]])).log_softmax(-1)[0]  # [4, V]
    cache = model.start_round(features)
    root = model.extend(cache, [5], [0], [[]])
    first = model.extend(cache, [3, 11], [1, 1], [[0], [0]])  # two siblings forwarded together
    second = model.extend(cache, [7], [2], [[0, 1]])  # under the first sibling only
    torch.testing.assert_close(root[0], forced[0])
    torch.testing.assert_close(first[0], forced[1])
    torch.testing.assert_close(second[0], forced[2])
    assert not torch.allclose(first[1], forced[1])  # the sibling read its own token


def _grown_and_forced(model: PathDrafter) -> tuple[torch.Tensor, torch.Tensor]:
    """log q of depths 1 and 2 grown from the round's cache, and the same from the teacher-forced pass, each `[2, V]`."""
    features = torch.randn(6, model.config.feature_size, generator=torch.Generator().manual_seed(1))
    window, valid = model.window(features)
    with torch.no_grad():
        forced = model.draft_logits(window, valid, torch.tensor([5]), torch.tensor([[3]])).log_softmax(-1)[0]
    cache = model.start_round(features)
    grown = torch.cat([model.extend(cache, [5], [0], [[]]), model.extend(cache, [3], [1], [[0]])])
    return grown, forced


def test_every_product_read_as_int8_stays_close_to_the_float_pass(target, monkeypatch):
    monkeypatch.setenv(INT8_ENV, "1")
    model: PathDrafter = tiny_block_drafter(target, conditioning="path").model
    grown, forced = _grown_and_forced(model)
    finite = forced.isfinite()
    assert torch.equal(grown.isfinite(), finite)
    assert not torch.allclose(grown[finite], forced[finite])  # int8 rows were read
    probabilities = grown.exp(), forced.exp()
    assert (probabilities[0] - probabilities[1]).abs().max() < 0.02


def test_the_fused_step_follows_a_change_of_the_weights(target, monkeypatch):
    monkeypatch.setenv(INT8_ENV, "0")
    model: PathDrafter = tiny_block_drafter(target, conditioning="path").model
    _grown_and_forced(model)  # builds the fused step
    with torch.no_grad():
        model.blocks[0].up.weight.mul_(3.0)  # in place: an optimiser's step
    grown, forced = _grown_and_forced(model)
    torch.testing.assert_close(grown, forced)


def test_warm_builds_the_fused_step_that_the_first_round_then_uses(target, monkeypatch):
    drafter = tiny_block_drafter(target, conditioning="path")
    assert getattr(drafter.model, "_step", None) is None
    drafter.warm()
    built = drafter.model._step
    state = drafter.new_state()
    state.add_features(torch.randn(5, drafter.model.config.feature_size))
    drafter.propose(DraftContext([1, 2, 5], max_depth=3), 4, state)
    assert drafter.model._step is built  # the round found it ready


def test_a_round_with_no_committed_features_yet_is_the_teacher_forced_pass_on_padding(target, monkeypatch):
    monkeypatch.setenv(INT8_ENV, "0")
    model: PathDrafter = tiny_block_drafter(target, conditioning="path").model
    window, valid = model.window(None)  # a one-token prompt: nothing before the root
    with torch.no_grad():
        forced = model.draft_logits(window, valid, torch.tensor([5]), torch.tensor([[3]])).log_softmax(-1)[0]
    cache = model.start_round(None)
    grown = torch.cat([model.extend(cache, [5], [0], [[]]), model.extend(cache, [3], [1], [[0]])])
    torch.testing.assert_close(grown, forced)


@pytest.mark.parametrize("budget", [1, 3, 8, 20])
def test_the_tree_keeps_the_best_scored_nodes_and_is_a_tree(target, budget):
    drafter = tiny_block_drafter(target, conditioning="path")
    state = drafter.new_state()
    state.add_features(torch.randn(5, drafter.model.config.feature_size))
    tree = drafter.propose(DraftContext([1, 2, 5], max_depth=10), budget, state)
    assert 1 <= tree.num_nodes - 1 <= budget and tree.tokens[0] == 5
    parents = tree.parents.tolist()
    assert all(parents[v] < v for v in range(1, tree.num_nodes))  # parents first
    for v in range(1, tree.num_nodes):  # a child never outscores its parent, and siblings differ
        assert tree.path_logprob[v] <= tree.path_logprob[parents[v]] + 1e-6
    siblings = [(parents[v], int(tree.tokens[v])) for v in range(1, tree.num_nodes)]
    assert len(set(siblings)) == len(siblings)
    assert int(tree.depths.max()) <= drafter.model.config.horizon
    chain = PathTreeDrafter(drafter.model, shape="chain").propose(DraftContext([1, 2, 5], max_depth=2), budget, state)
    assert chain.parents.tolist() == list(range(-1, chain.num_nodes - 1)) and chain.num_nodes - 1 == min(budget, 2)


def test_no_node_below_the_contexts_floor_is_grown(target):
    drafter = tiny_block_drafter(target, conditioning="path")
    state = drafter.new_state()
    state.add_features(torch.randn(5, drafter.model.config.feature_size))
    free = drafter.propose(DraftContext([1, 2, 5], max_depth=10), 20, state)
    floor = float(free.path_logprob[1:].exp().max()) * 1.01  # above every drafted node
    floored = drafter.propose(DraftContext([1, 2, 5], max_depth=10, min_path_prob=floor), 20, state)
    assert int(free.depths.max()) > 1
    assert int(floored.depths.max()) == 1  # the root's children are proposed; none is worth growing


def test_no_room_left_gives_the_root_alone(target):
    drafter = tiny_block_drafter(target, conditioning="path")
    tree = drafter.propose(DraftContext([1, 2], max_depth=0), 8, drafter.new_state())
    assert tree.num_nodes == 1


def test_it_learns_a_path_that_the_marginals_cannot_express(target):
    # two continuations share their first token's law but differ after it: a -> b -> c or a' -> b' -> c'
    # where depth 2 is decided by depth 1; marginals of depth 2 stay split, the path drafter resolves them
    torch.manual_seed(0)
    rows = []
    for i in range(64):
        first = 10 + (i % 2)
        rows.append([1, 2, 3, first, 20 + first, 40 - first])
    data = TrainData.from_lists(rows, [3] * len(rows))
    layers = [1, 2]
    hidden = target.config.hidden_size
    data.features = torch.zeros(*data.token_ids.shape, len(layers) * hidden)  # no hint from the target: only the path tells
    results = {}
    for conditioning in ("marginal", "path"):
        model = tiny_block_drafter(target, conditioning=conditioning).model.float().train()
        list(train(model, data, TrainSettings(steps=60, batch=32, lr=1e-2, warmup=5, short_history_share=0.0)))
        results[conditioning] = heldout_loss(model, data)["top1_by_depth"]
    # depth 2 is labelled at two anchors: the one whose root is the last prompt token (depth 1 a coin
    # flip, depth 2 decided by it) and the next (decided by its root): marginals reach 3 in 4 at most
    assert results["path"][1] > 0.95 and results["marginal"][1] < 0.8


def test_a_path_drafter_folder_loads_as_one_and_refuses_the_block_class(target, tmp_path):
    model = tiny_block_drafter(target, conditioning="path").model
    model.save_pretrained(tmp_path / "path")
    loaded = load_block_drafter(tmp_path / "path", target)
    assert isinstance(loaded, PathTreeDrafter) and loaded.name == "path"
    with pytest.raises(ValueError, match="not a BlockDrafter"):
        BlockDrafter.from_pretrained(tmp_path / "path", target)
    with pytest.raises(ModelLoadError):
        load_block_drafter(tmp_path / "nothing", target)


def test_a_pair_offers_only_the_drafters_it_ships():
    # the registry knows the path kind for the default pair; until its folder holds a drafter the page
    # does not offer it (choosing it would only be refused), nor the AR drafter it never shipped
    from tev.engine.models import PAIRS, offered_kinds

    assert offered_kinds(PAIRS["smollm2"]) == [kind for kind in ("block", "exittrain", "path", "chain") if kind != "path" or
                                                (PAIRS["smollm2"].drafter_folder("path") / "drafter.safetensors").is_file()]
    assert offered_kinds(PAIRS["tiny"]) == ["block", "exittrain", "chain"]  # its AR drafter is built by tests, not shipped


def test_a_session_starts_with_the_pairs_default_drafter_where_it_ships_it(tmp_path, monkeypatch):
    from dataclasses import replace

    from tev.engine import models

    pair = replace(models.PAIRS["smollm2"], name="copy", default_drafter="path")
    monkeypatch.setattr(models, "models_dir", lambda: tmp_path)
    block = pair.drafter_folder("block")
    block.mkdir(parents=True)
    (block / "drafter.safetensors").write_bytes(b"")
    assert models.default_kind(pair) == "block"  # the path drafter is not there: the block drafter, not a refusal
    path = pair.drafter_folder("path")
    path.mkdir(parents=True)
    (path / "drafter.safetensors").write_bytes(b"")
    assert models.default_kind(pair) == "path"
    assert models.default_kind(models.PAIRS["tiny"]) == "block"


@pytest.mark.parametrize("conditioning", ["marginal", "path"])
def test_a_rounds_state_keeps_only_the_window_it_reads_and_drafts_the_same_tree(target, conditioning):
    drafter = tiny_block_drafter(target, conditioning=conditioning)
    width = drafter.model.config.context_window
    history = torch.randn(3 * width + 1, drafter.model.config.feature_size)
    state = drafter.new_state()
    for start in range(0, history.shape[0], 3):  # a round's accepted path at a time
        state.add_features(history[start:start + 3])
    assert torch.equal(state.features, history[-width:])
    whole = type(state)(features=history)  # every row kept, as before the window
    context = DraftContext([1, 2, 5], max_depth=6)
    kept, full = drafter.propose(context, 8, state), drafter.propose(context, 8, whole)
    assert torch.equal(kept.tokens, full.tokens) and torch.equal(kept.parents, full.parents)


def test_a_path_drafter_whose_step_reads_int8_rows_is_served_in_float32(monkeypatch):
    """Its products then never run in the drafter's dtype: bfloat16 would only add conversions around the norms and
    attention. Without int8 rows it takes the precision measured on its step's product size, as every drafter."""
    import tev.engine.path_drafter as path_module
    from tev.engine.block_drafter import DrafterBody
    from tev.util.precision import low_precision

    monkeypatch.setattr(path_module, "use_int8_head", lambda device="cpu": True)
    monkeypatch.setattr(DrafterBody, "serving_dtype", classmethod(lambda cls, device: torch.bfloat16))  # as measured on a bfloat16 CPU
    assert path_module.PathDrafter.serving_dtype("cpu") == torch.float32
    monkeypatch.setattr(path_module, "use_int8_head", lambda device="cpu": False)
    assert path_module.PathDrafter.serving_dtype("cpu") == torch.bfloat16
    monkeypatch.undo()
    assert DrafterBody.serving_dtype("cpu") == low_precision("cpu", DrafterBody.PRECISION_SHAPE)
