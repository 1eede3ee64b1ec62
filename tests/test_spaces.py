"""Hugging Face Spaces: the handlers hold a ZeroGPU GPU only where the `spaces` package and a
ZeroGPU Space are present, and are left as they are everywhere else."""

import functools
import importlib
import os
import sys
import types

import pytest

import ui.gpu
from tev.util.cpus import available_cpus


@pytest.fixture
def zero_gpu(monkeypatch):
    """A stand-in `spaces` package whose GPU decorator records the duration it was given."""
    granted = []

    def gpu(duration=60):
        def decorate(handler):
            @functools.wraps(handler)
            def wrapper(*args, **kwargs):
                return handler(*args, **kwargs)

            wrapper.gpu_duration = duration
            granted.append((handler.__name__, duration))
            return wrapper

        return decorate

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=gpu))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    importlib.reload(ui.gpu)
    yield granted
    monkeypatch.undo()
    importlib.reload(ui.gpu)  # back to this machine's truth (no spaces package)
    if "app" in sys.modules:
        importlib.reload(sys.modules["app"])


def handler(x):
    return x + 1


def test_without_spaces_the_handlers_are_left_as_they_are():
    assert ui.gpu.spaces is None and not ui.gpu.ZERO_GPU
    assert ui.gpu.gpu_task("generate")(handler) is handler
    assert ui.gpu.quota_note("generate") == ""


def test_on_zero_gpu_each_handler_holds_the_gpu_for_its_own_duration(zero_gpu):
    assert ui.gpu.ZERO_GPU
    wrapped = ui.gpu.gpu_task("exittrain")(handler)
    assert wrapped.gpu_duration == ui.gpu.GPU_SECONDS["exittrain"] == 240 and wrapped(1) == 2
    assert "240 s" in ui.gpu.quota_note("exittrain")
    with pytest.raises(KeyError):
        ui.gpu.gpu_task("unknown")


def test_the_app_wraps_every_model_handler_on_zero_gpu_and_none_elsewhere(zero_gpu):
    import app

    app = importlib.reload(app)  # wired with the stand-in spaces package
    demo = app.build_app()
    functions = {fn.api_name: fn for fn in demo.fns.values()}
    durations = {name: getattr(fn.fn, "gpu_duration", None) for name, fn in functions.items()}
    assert durations["generate"] == 60 and durations["verifier_lab"] == 60
    assert durations["exittrain"] == 240 and durations["compare_shipped"] == 90
    assert durations["exittrain_cancel"] is None and durations["browse_round"] is None  # no model work, no GPU time
    assert functions["exittrain"].tracks_progress  # Gradio still sees the handler's progress bar through the wrapper
    # the page tells a visitor what one press costs
    notes = [block.value for block in demo.blocks.values() if getattr(block, "value", None) and "daily GPU quota" in str(block.value)]
    assert len(notes) == 3


def test_threads_follow_the_containers_cpu_quota_not_the_hosts_core_count(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("200000 100000\n")  # a 2-vCPU Space on a larger host
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert available_cpus(cpu_max) == 2
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: round up
    assert available_cpus(cpu_max) == 2
    cpu_max.write_text("max 100000\n")  # no quota: the affinity decides
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert available_cpus(cpu_max) == 3
    assert available_cpus(tmp_path / "missing") == 3
