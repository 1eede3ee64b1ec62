"""The house's layers: every import inside ``tev/`` points down, and the math imports no models."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TEV = Path(__file__).resolve().parent.parent / "tev"
# bottom to top; a module may import its own layer and the ones before it
LAYERS = ("util", "core", "data", "engine", "train", "pipelines", "service", "bench", "drive", "cli")
MODEL_LIBRARIES = ("transformers", "accelerate", "gradio", "plotly", "matplotlib")


def _layer(module: str) -> str:
    """``tev.engine.decode`` -> ``engine``; ``tev.cli`` / ``tev.__main__`` -> ``cli``."""
    parts = module.split(".")
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


MODULES = sorted(p for p in TEV.rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(("tev", *path.relative_to(TEV).with_suffix("").parts))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TEV)))
def test_imports_point_down(path):
    own = _layer(_module_name(path))
    assert own in LAYERS, f"{path} is in no known layer"
    for line, module, _ in _imports(path):
        if module.startswith("tev."):
            assert LAYERS.index(_layer(module)) <= LAYERS.index(own), f"{path}:{line} ({own}) imports {module} from a layer above"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TEV)))
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
    """The walker finds an import inside a function and reads its layer."""
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from tev.bench.e2e import bench_e2e\n")
    assert _imports(sample) == [(1, "os", False), (4, "tev.bench.e2e", True)]
    assert LAYERS.index(_layer("tev.bench.e2e")) > LAYERS.index(_layer("tev.engine.decode"))
