"""Print the workload-adaptation ablation as markdown from the result files of
``python -m tev exittrain --workload PACK.json --json OUT.json --controls none reach exit-depth next-depth``.

    python scripts/workload_table.py runs/workload/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = {"exittrain": "adapted (the run's tree term)", "token_only": "token-only control"}


def cell(result: dict, key: str, name: str) -> str:
    row = result[key][name]
    text = f"{row['tau']:.3f} +- {row['se']:.3f}"
    if name != "base":
        gain = result["gain"][key][name]
        text += f" ({100 * gain['gain']:+.1f}% +- {100 * gain['se']:.1f}%)"
    return text


def main(paths: list[str]) -> None:
    results = {Path(p).stem: json.loads(Path(p).read_text()) for p in sorted(paths)}
    if not results:
        raise SystemExit("give the result files of `python -m tev exittrain --workload ... --json OUT.json`")
    for key, title in (("T0", "T = 0 (greedy)"), ("T1", "T = 1 (TEV)")):
        names = list(next(iter(results.values()))[key])
        print(f"\n{title}, B = 16, 64 new tokens: tau on held-out prompts (+- s.e.; change against the base)\n")
        print("| pack | " + " | ".join(NAMES.get(n, n) for n in names) + " |")
        print("|---" * (len(names) + 1) + "|")
        for pack, result in results.items():
            print(f"| {pack} | " + " | ".join(cell(result, key, n) for n in names) + " |")
        means = {n: sum(r["gain"][key][n]["gain"] for r in results.values()) / len(results) for n in names if n != "base"}
        print("\nMean change over packs: " + ", ".join(f"{NAMES.get(n, n)} {100 * g:+.1f}%" for n, g in means.items()))
    print("\n| pack | train / held-out prompts | answer tokens | new draft tokens | steps | minutes (answers, fine-tune, base and adapted measured) |")
    print("|---|---|---|---|---|---|")
    for pack, r in results.items():
        print(f"| {pack} | {r['train_prompts']} / {r['heldout_prompts']} | {r['answer_tokens']} | {r['vocab_added']} | {r['steps']} | {r['minutes']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
