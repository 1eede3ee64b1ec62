"""The continuous-batching data writer: greedy answers equal the target's own greedy decoding
whatever the slot count, the refills, the shared prefix and the shrinking batch; sampled answers
follow the target's tempered law; an answer depends on its prompt and seed, not on its slot."""

from __future__ import annotations

import pytest
import torch

from tev.bench.exactness import ALPHA, chi_square_against
from tev.engine.batch_writer import BatchWriter, WriterPrompt, writer_unsupported_reason
from tests.test_batch_generate import _greedy_alone, tempered_law
from tests.tiny import tiny_target

PREFIX = [40, 41, 42, 43]  # a shared first turn, as a chat template's system prompt
PROMPTS = [PREFIX + tail for tail in ([5], [7, 8, 9, 10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34], [6, 6], [50, 51, 52, 53, 54, 55])]


def _answers(writer: BatchWriter, prompts, new_tokens: int, stop=None, temperature=0.0, seed=0, refill: int = 2) -> list[list[int]]:
    items = [WriterPrompt(tuple(p), temperature, seed + i) for i, p in enumerate(prompts)]
    answers: dict[int, list[int]] = {}
    for item in writer.run(items, new_tokens, stop, refill=refill):
        if item is not None:
            index, answer = item
            assert index not in answers
            answers[index] = list(answer)
    return [answers[i] for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["llama", "qwen"])
@pytest.mark.parametrize("slots", [1, 2, 4, 8])
def test_greedy_answers_equal_decoding_each_prompt_alone(arch, slots):
    target = tiny_target(64, arch=arch, scale=4.0)
    writer = BatchWriter(target, slots=slots, max_length=40)
    written = _answers(writer, PROMPTS, 12)
    assert written == [_greedy_alone(target, p, 12, None) for p in PROMPTS]
    assert writer.slots <= slots  # the batch halved once no prompt waited
    assert _answers(writer, PROMPTS[:2], 12) == written[:2]  # a second run starts with every slot again


def test_an_answer_ends_at_the_stop_token_and_its_slot_serves_the_next_prompt():
    target = tiny_target(64, scale=4.0)
    alone = [_greedy_alone(target, p, 12, None) for p in PROMPTS]
    stop = alone[1][2]
    written = _answers(BatchWriter(target, slots=2, max_length=40), PROMPTS, 12, stop=stop, refill=1)
    for row, reference in zip(written, alone):
        assert row == (reference[: reference.index(stop) + 1] if stop in reference else reference)
    assert written[1][-1] == stop and len(written[1]) <= 3


def test_prompts_without_a_shared_prefix_and_one_token_prompts():
    target = tiny_target(64, scale=4.0)
    prompts = [[5], [9, 1, 2], [33]]
    assert _answers(BatchWriter(target, slots=2, max_length=20), prompts, 6) == [_greedy_alone(target, p, 6, None) for p in prompts]


def test_sampled_answers_follow_the_tempered_law_and_do_not_depend_on_their_slot():
    target = tiny_target(24, scale=2.0)
    prompt = [3, 4, 5]
    temperature = 0.7
    law = tempered_law(target, prompt, temperature)
    firsts = [a[0] for a in _answers(BatchWriter(target, slots=64, max_length=8), [prompt] * 4000, 1, temperature=temperature, refill=64)]
    statistic, p_value, dof = chi_square_against(law, firsts)
    assert p_value > ALPHA, f"chi-square {statistic:.1f} on {dof} dof"
    # the same seeds in another slot count give the same answers (one generator per prompt)
    few = _answers(BatchWriter(target, slots=3, max_length=12), [prompt] * 9, 6, temperature=1.0, seed=11)
    many = _answers(BatchWriter(target, slots=9, max_length=12), [prompt] * 9, 6, temperature=1.0, seed=11)
    assert few == many and len({tuple(a) for a in few}) > 1


def test_the_sampler_never_draws_a_zero_weight_token_and_greedy_rows_take_the_argmax():
    logits = torch.full((3, 600), float("-inf"))
    logits[:, [0, 255, 256, 599]] = torch.tensor([0.0, 1.0, 2.0, 0.5])
    generators = [torch.Generator().manual_seed(i) for i in range(3)]
    for _ in range(200):
        drawn = BatchWriter._draw(logits, torch.tensor([1.0, 0.0, 3.0]), generators)
        assert set(drawn.tolist()) <= {0, 255, 256, 599} and int(drawn[1]) == 256


def test_bad_prompts_are_refused_and_other_models_are_named():
    target = tiny_target(64)
    writer = BatchWriter(target, slots=2, max_length=10)
    with pytest.raises(ValueError, match="at least one token"):
        list(writer.run([WriterPrompt((1,), 0.0, 0), WriterPrompt((), 0.0, 1)], 4, None))
    with pytest.raises(ValueError, match="longer than the writer"):
        list(writer.run([WriterPrompt(tuple(range(1, 9)), 0.0, 0)], 4, None))
    assert list(writer.run([], 4, None)) == []
    assert writer_unsupported_reason(target) is None

    class _Other:
        config = type("Config", (), {"model_type": "gpt2"})()

        def parameters(self):
            yield torch.zeros(1)

        def get_output_embeddings(self):
            return None

    assert "gpt2" in writer_unsupported_reason(_Other())


def test_the_data_writer_bench_times_both_writers_on_the_same_requests(tmp_path):
    import argparse

    from tev.bench import data_writer
    from tev.util.stored import read_result
    from tests.tiny import save_chat_target

    folder = save_chat_target(tmp_path / "chat")
    parser = argparse.ArgumentParser()
    data_writer.add_arguments(parser)
    out = tmp_path / "writer.json"
    args = parser.parse_args(["--target", str(folder), "--requests", "6", "--response-tokens", "5", "--slots", "4", "--passes", "2", "--json", str(out)])
    assert data_writer.run(args) == 0
    result = read_result(out, "data-writer")
    passes = result["timing"]["1"]["passes"]
    assert len(passes) == 2 and result["continuous_writer"]["rows"] == 4
    for row in passes:
        assert row["batch"]["tokens"] > 0 and row["continuous"]["tokens"] > 0 and row["ratio_cpu"] > 0
