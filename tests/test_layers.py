"""The house's layers: every import in ``tev/``, ``visual/``, ``ui/`` and ``app.py`` points down, and
the math imports no models."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEV = ROOT / "tev"
# Each layer and the layers it stands on; a module may import its own layer and every layer beneath
# it. The app (service, visual, ui, app.py) and the benchmarks stand side by side on the library, so
# neither imports the other; what starts and drives the app from outside stands on both.
STANDS_ON = {
    "util": (),
    "core": ("util",),
    "data": ("core",),
    "engine": ("data",),
    "train": ("engine",),
    "pipelines": ("train",),
    "service": ("pipelines",),  # the app's server side
    "visual": ("engine",),  # the app's figures
    "ui": ("service", "visual"),
    "app": ("ui",),
    "bench": ("service",),  # the paper's benchmarks; `bench exittrain --live` measures the service's live mode
    "drive": ("app", "bench"),  # starts the app and drives it from outside
    "cli": ("drive",),
}
MODEL_LIBRARIES = ("transformers", "accelerate", "gradio", "plotly", "matplotlib")


def _beneath(layer: str) -> set[str]:
    """``layer`` and every layer it stands on, directly or through another."""
    found = {layer}
    for lower in STANDS_ON[layer]:
        found |= _beneath(lower)
    return found


def _layer(module: str) -> str | None:
    """``tev.engine.decode`` -> ``engine``; ``tev.cli`` / ``tev.__main__`` -> ``cli``; ``ui.live`` -> ``ui``;
    ``visual.charts`` -> ``visual``; ``app`` -> ``app``; a module outside the house -> None."""
    parts = module.split(".")
    if parts[0] in ("ui", "visual", "app"):
        return parts[0]
    if parts[0] != "tev":
        return None
    if len(parts) < 2 or parts[1] in ("cli", "__main__", "__init__"):
        return "cli"
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, inside a function) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                found.append((child.lineno, child.module, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


MODULES = sorted([*TEV.rglob("*.py"), *(ROOT / "visual").rglob("*.py"), *(ROOT / "ui").rglob("*.py"), ROOT / "app.py"])


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    own = _layer(_module_name(path))
    assert own in STANDS_ON, f"{path} is in no known layer"
    for line, module, _ in _imports(path):
        layer = _layer(module)
        if layer is not None:
            assert layer in _beneath(own), f"{path}:{line} ({own}) imports {module} from {layer}, which does not stand beneath it"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_hides_in_a_function(path):
    hidden = [(line, module) for line, module, in_function in _imports(path) if in_function]
    assert not hidden, f"{path}: imports inside functions {hidden}"


def test_the_math_imports_no_model_library():
    for path in (TEV / "core").rglob("*.py"):
        for line, module, _ in _imports(path):
            assert module.split(".")[0] not in MODEL_LIBRARIES, f"{path}:{line} imports {module}"
            if module.startswith("tev."):
                assert _layer(module) in ("util", "core"), f"{path}:{line} imports {module}"


def test_the_checker_sees_a_violation(tmp_path):
    """The walker finds an import inside a function and reads its layer; the app and the benchmarks
    stand apart, and what drives the app stands above both."""
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from tev.bench.e2e import bench_e2e\n")
    assert _imports(sample) == [(1, "os", False), (4, "tev.bench.e2e", True)]
    assert _layer("tev.bench.e2e") not in _beneath(_layer("tev.engine.decode"))
    assert _layer("tev.drive.loadtest") not in _beneath(_layer("ui.live")) | _beneath(_layer("tev.service.service"))
    assert _layer("tev.bench.e2e") not in _beneath(_layer("app")) and _layer("ui.live") not in _beneath(_layer("tev.bench.e2e"))
    assert {"app", "bench"} <= _beneath(_layer("tev.drive.loadtest")) and _layer("torch") is None
