"""The workload-adaptation ablation as markdown, from the result files of
``python -m tev adapt --workload PACK.json --json OUT.json --controls none reach exit-depth next-depth``;
with ``--install``, also the model card's workload table (``assets/models/smollm2/workload-results.json``, then
the card re-rendered).

    python -m tev bench workload-table runs/workload/*.json [--install]
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from tev.bench.report.workload_gain import workload_data, workload_section
from tev.engine.models import DEFAULT_PAIR
from tev.pipelines.card import refresh_card
from tev.pipelines.workload_report import LAWS
from tev.util.paths import assets_dir
from tev.util.stored import read_result, write_result


def print_tables(results: dict[str, dict]) -> None:
    """Claim 5b's tables of the report (tau per drafter and its change, per pack and temperature), then each run's size and time."""
    print("\n".join(workload_section({"measurements": {"workload": workload_data(results)}})))
    print("| pack | train / held-out prompts | answer tokens | new draft tokens | steps | minutes (answers, fine-tune, base and adapted measured) |")
    print("|---|---|---|---|---|---|")
    for pack, r in results.items():
        print(f"| {pack} | {r['train_prompts']} / {r['heldout_prompts']} | {r['answer_tokens']} | {r['vocab_added']} | {r['steps']} | {r['minutes']:.1f} |")


def command_of(path: Path, result: dict) -> str:
    """The command that measured ``result`` (recorded by the command; rebuilt for older files)."""
    if result.get("command"):
        return result["command"]
    first_law = next(iter(LAWS))  # every result measured it, and its cells name every drafter
    controls = ["none" if n == "token_only" else n for n in result[first_law] if n not in ("base", "adapted")]
    stem = Path(result["workload"]).stem
    return shlex.join(["python", "-m", "tev", "adapt", "--workload", result["workload"], "--json", f"runs/workload/{stem}.json", "--out", f"runs/workload/{stem}",
                       "--controls", *controls])


def task_of(workload: str) -> str:
    """The pack's instruction, from its first prompt: up to the colon that introduces the input, else its first 100 characters."""
    first = json.loads(Path(workload).read_text())[0]
    colon = first.find(":")
    text = first[: colon + 1] if 0 < colon <= 110 else (first[:100] + "…" if len(first) > 100 else first)
    return text.replace("|", "\\|")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="result files of `python -m tev adapt --workload ... --json OUT.json`")
    parser.add_argument("--install", action="store_true", help="write assets/models/smollm2/workload-results.json and re-render the model card")


def run(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in sorted(args.results)]
    read = {path: read_result(path, "workload") for path in paths}
    results = {Path(result.get("workload", path)).stem: result for path, result in read.items()}
    print_tables(results)
    if args.install:
        entries = {}
        for path, result in read.items():
            keep = {k: result[k] for k in (*LAWS, "gain", "minutes", "train_prompts", "heldout_prompts", "answer_tokens", "vocab_added", "steps", "settings")
                    if k in result}
            entries[Path(result["workload"]).stem] = {"task": task_of(result["workload"]), "command": command_of(path, result), "result": keep}
        write_result(assets_dir() / "models" / DEFAULT_PAIR.home / "workload-results.json", "workload-table", {"packs": entries})
        refresh_card(assets_dir())
        print(f"\nwrote {assets_dir() / 'models' / DEFAULT_PAIR.home / 'workload-results.json'}; model card re-rendered")
    return 0
