"""The batched data writer: greedy rows equal the target's own greedy decoding whatever the
padding, finished rows stop, and sampling at T draws from the target's tempered law."""

from __future__ import annotations

import pytest
import torch

from tev.engine.batch_generate import generate_batch
from tev.bench.exactness import ALPHA, chi_square_against
from tests.tiny import tiny_target


def _greedy_alone(target, prompt: list[int], new_tokens: int, stop: int | None) -> list[int]:
    """Greedy decoding of one unpadded prompt, a full forward per token (no cache)."""
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(new_tokens):
            token = int(target(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token == stop:
                break
    return out


PROMPTS = [[5], [7, 8, 9, 10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34]]


@pytest.mark.parametrize("arch", ["llama", "qwen"])
def test_greedy_rows_equal_decoding_each_prompt_alone(arch):
    target = tiny_target(64, arch=arch, scale=4.0)
    written = generate_batch(target, PROMPTS, 12, 0.0, None, seed=0, pad_id=0)
    assert [len(row) for row in written] == [12] * len(PROMPTS)
    for prompt, row in zip(PROMPTS, written):
        assert row == _greedy_alone(target, prompt, 12, None)


def test_a_row_that_writes_the_stop_token_leaves_the_batch_and_the_others_go_on():
    target = tiny_target(64, scale=4.0)
    alone = [_greedy_alone(target, p, 12, None) for p in PROMPTS]
    stop = alone[1][2]  # row 1 writes this token third: it must end there, stop included
    written = generate_batch(target, PROMPTS, 12, 0.0, stop, seed=0, pad_id=0)
    for row, reference in zip(written, alone):
        expected = reference[: reference.index(stop) + 1] if stop in reference else reference
        assert row == expected
    assert len(written[1]) <= 3 and written[1][-1] == stop


def tempered_law(target, prompt: list[int], temperature: float) -> dict[int, float]:
    """The target's exact next-token law after ``prompt`` at ``temperature``: token -> probability."""
    with torch.no_grad():
        law = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double() / temperature, -1)
    return {token: float(p) for token, p in enumerate(law)}


def test_sampling_draws_from_the_tempered_target_law():
    target = tiny_target(24, scale=2.0)
    prompt = [3, 4, 5]
    temperature = 0.7
    law = tempered_law(target, prompt, temperature)
    draws = []
    for seed in range(5):
        draws += [row[0] for row in generate_batch(target, [prompt] * 800, 1, temperature, None, seed=seed)]
    statistic, p_value, dof = chi_square_against(law, draws)
    assert p_value > ALPHA, f"chi-square {statistic:.1f} on {dof} dof"
    # the second token follows the law after each row's own first token (rows drawing the likeliest first token)
    pairs = generate_batch(target, [prompt] * 3000, 2, temperature, None, seed=9)
    first = max(law, key=law.get)
    seconds = [row[1] for row in pairs if row[0] == first]
    statistic, p_value, dof = chi_square_against(tempered_law(target, prompt + [first], temperature), seconds)
    assert p_value > ALPHA, f"chi-square {statistic:.1f} on {dof} dof"


def test_the_same_seed_writes_the_same_rows_and_bad_input_is_refused():
    target = tiny_target(64)
    assert generate_batch(target, PROMPTS, 6, 1.0, None, seed=3) == generate_batch(target, PROMPTS, 6, 1.0, None, seed=3)
    assert generate_batch(target, [], 6, 1.0, None, seed=3) == []
    assert generate_batch(target, PROMPTS, 0, 1.0, None, seed=3) == [[] for _ in PROMPTS]
    with pytest.raises(ValueError, match="at least one token"):
        generate_batch(target, [[1], []], 4, 0.0, None, seed=0)


def test_a_truncated_law_draws_from_the_cut_law_and_top_k_one_is_greedy():
    from tev.core.sampling import SamplingLaw

    target = tiny_target(24, scale=2.0)
    prompt = [3, 4, 5]
    law = SamplingLaw(0.8, top_p=0.7)
    with torch.no_grad():
        expected = law.probs(target(torch.tensor([prompt])).logits[0, -1:])[0].double()
    kept = {token: float(p) for token, p in enumerate(expected) if p > 0}
    assert 1 < len(kept) < 24  # the cut removes some tokens and keeps more than one
    draws = []
    for seed in range(4):
        draws += [row[0] for row in generate_batch(target, [prompt] * 800, 1, law, None, seed=seed)]
    assert set(draws) <= set(kept)  # nothing outside the nucleus is ever written
    statistic, p_value, dof = chi_square_against(kept, draws)
    assert p_value > ALPHA, f"chi-square {statistic:.1f} on {dof} dof"
    wide = tiny_target(64, scale=4.0)
    assert generate_batch(wide, PROMPTS, 8, SamplingLaw(1.3, top_k=1), None, seed=5) == generate_batch(wide, PROMPTS, 8, 0.0, None, seed=0)
