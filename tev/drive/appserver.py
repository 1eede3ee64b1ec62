"""Start the real app (``python app.py``) as a subprocess on a free port: the load test, the page
measurements and the app, browser and reliability tests drive it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tev.util.paths import REPO_ROOT as REPO


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AppServer:
    """``python app.py`` with ``TEV_ASSETS_DIR`` pointing at a given assets folder."""

    def __init__(self, assets: Path, log: Path, extra_env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        inherited = {k: v for k, v in os.environ.items() if k != "GRADIO_SERVER_NAME"}  # the app's own default host is under test
        env = {**inherited, "TEV_ASSETS_DIR": str(assets), "GRADIO_SERVER_PORT": str(self.port), "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        self.log = open(log, "w")
        self.started = time.time()
        self.process = subprocess.Popen([sys.executable, str(REPO / "app.py")], cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds until the page answered."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the app exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    if response.status == 200:
                        return time.time() - self.started
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"the app did not answer within {timeout}s; see {self.log.name}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the server (a crash: no clean-up runs), and wait for it to be gone."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        if not self.log.closed:
            self.log.close()


def quick_assets(folder: Path) -> Path:
    """Build the miniature assets (``build-assets --quick``) into ``folder``; returns it."""
    work = folder.parent / (folder.name + "-work")
    subprocess.run(
        [sys.executable, "-m", "tev", "build-assets", "--quick", "--out", str(folder), "--work-dir", str(work)],
        cwd=REPO, check=True, capture_output=True, text=True,
    )
    return folder
