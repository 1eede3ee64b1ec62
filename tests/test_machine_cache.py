"""A start's measurements kept for the next start on the same machine: read back where everything
they depend on is the same, measured again where anything differs, never trusted when unreadable."""

import json

import pytest
import torch

from tev.engine import cost_curve, target_precision
from tev.engine.cost_curve import machine_cost_curve
from tev.engine.target import Target
from tev.engine.target_precision import choose_target_forward, forced_target_forward
from tev.util import machine_cache
from tev.util.machine_cache import CACHE_ENV, cache_file, recall, remember
from tests.tiny import tiny_block_drafter, tiny_target


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path / "machine-measurements.json"


def test_an_entry_is_read_back_for_the_same_parts_on_the_same_machine_only(cache, monkeypatch):
    assert recall("times", {"model": "a"}) is None
    remember("times", {"model": "a"}, {"ms": 3.0})
    kept = recall("times", {"model": "a"})
    assert kept["ms"] == 3.0 and len(kept["measured_at"]) == 10  # a UTC date
    assert recall("times", {"model": "b"}) is None and recall("other", {"model": "a"}) is None
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert recall("times", {"model": "a"}) is None  # another thread count is another measurement
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(machine_cache, "_cpu", lambda: {"model": "another CPU", "flags": "avx2"})
    assert recall("times", {"model": "a"}) is None


def test_an_unreadable_file_is_measured_over_and_an_unwritable_folder_changes_nothing(cache, tmp_path, monkeypatch):
    cache.write_text("{not json")
    assert recall("times", {"model": "a"}) is None
    remember("times", {"model": "a"}, {"ms": 1.0})
    assert json.loads(cache.read_text())["version"] == 1 and recall("times", {"model": "a"})["ms"] == 1.0
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocked))  # its folder cannot be made
    remember("times", {"model": "a"}, {"ms": 1.0})
    assert recall("times", {"model": "a"}) is None
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_file() is None and recall("times", {"model": "a"}) is None


def test_a_second_start_reads_the_forward_choice_back_instead_of_checking_and_timing_again(cache, monkeypatch):
    first = choose_target_forward(Target(tiny_target(48, context=256)))
    assert "measured at a start on" not in first.reason and cache.is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(target_precision, "_measure", refuse)
    monkeypatch.setattr(target_precision, "_refusal", refuse)
    again = choose_target_forward(Target(tiny_target(48, context=256)))  # a new process's model: nothing in memory
    assert (again.forward, again.dtype, again.step_ms, again.refused) == (first.forward, first.dtype, first.step_ms, first.refused)
    assert "measured at a start on" in again.reason
    with forced_target_forward(Target(tiny_target(48, context=256)), "float32") as forced:  # a forced forward reads its check back too
        assert forced.forward in ("row-invariant", "transformers")
    other = choose_target_forward(Target(tiny_target(40, context=256)))  # another vocabulary: other shapes, checked again (and refused here, by the stub)
    assert "measured again" in other.refused["row-invariant float32"]


def test_a_second_start_reads_the_cost_curve_back(cache, monkeypatch):
    monkeypatch.setenv(target_precision.FORWARD_ENV, "transformers")
    target = Target(tiny_target(48, context=256))
    choose_target_forward(target)
    measured = machine_cost_curve(target).measured
    monkeypatch.setattr(cost_curve, "measure_forward_costs", lambda *args, **kwargs: pytest.fail("measured again"))
    other = Target(tiny_target(48, context=256))
    choose_target_forward(other)
    assert machine_cost_curve(other).measured == measured
    cache.write_text(cache.read_text().replace('"seconds": {"1": ', '"seconds": {"1": -'))  # a negative time is not read back
    third = Target(tiny_target(48, context=256))
    choose_target_forward(third)
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        machine_cost_curve(third)


def test_a_drafters_thread_check_is_read_back_on_the_next_start(tmp_path, monkeypatch):
    """The server's check that a drafter's rounds are the same at both thread counts runs once per machine."""
    from tev.engine import drafter_threads

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    target = tiny_target(48, context=256)
    drafter = tiny_block_drafter(target)
    runs = []
    monkeypatch.setattr(drafter_threads, "proposals_agree_across_threads", lambda *args: runs.append(args) or False)
    runner = Target(target)
    assert drafter_threads.agree_here(runner, drafter, (1, 2)) is False and len(runs) == 1
    assert drafter_threads.agree_here(runner, drafter, (1, 2)) is False and len(runs) == 1  # read back
    drafter_threads.agree_here(runner, drafter, (1, 3))  # other counts: checked again
    assert len(runs) == 2
