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
warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def quick_assets_dir(tmp_path_factory):
    """Miniature assets built by `python -m tev build-assets --quick` (once per test run)."""
    from tests.appserver import quick_assets

    return quick_assets(tmp_path_factory.mktemp("quick") / "assets")


@pytest.fixture(scope="session")
def app_server(quick_assets_dir, tmp_path_factory):
    """The real app (`python app.py`) serving the quick assets on a free port."""
    from tests.appserver import AppServer

    server = AppServer(quick_assets_dir, tmp_path_factory.mktemp("app") / "app.log")
    try:
        server.ready_seconds = server.wait_ready()
        yield server
    finally:
        server.stop()
