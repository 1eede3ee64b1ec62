"""Why ExitTrain gains little on the default pair: one short fine-tune per setting, each from the
shipped base drafter on the same data and seed, judged on the same held-out rounds.

Each variant changes one thing against the reference (exit weights, lambda 16, training trees of
budget 32 at T = 1, lr 1e-4): lambda, the training trees' temperature and budget, the learning
rate, the token-only control. For each: held-out ``1 + C`` before / after (paired over anchors,
with its standard error) and where the target's mass leaves the trees, by depth.

    python scripts/exittrain_diagnosis.py --steps 40 --out runs/exittrain-diagnosis.json

About 3 minutes per variant on a 2-core CPU; resumable (finished variants are kept in --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tev.engine.models import DEFAULT_PAIR, load_bundle  # noqa: E402
from tev.service.live_exittrain import CHAT_LIVE_SETTINGS, live_experiment  # noqa: E402
from tev.pipelines.exittrain_data import load_chat_exittrain_data  # noqa: E402
from tev.train.loop import with_progress  # noqa: E402

REFERENCE = CHAT_LIVE_SETTINGS  # exit term, lambda_tree 16, B 32, T 1, lr 1e-4, 2 conversations x 16 anchors a step
VARIANTS = {
    "reference (exit, lambda_tree 16, B 32, T 1, lr 1e-4)": {},
    "token-only control (none)": {"tree_term": "none"},
    "lambda_tree 4": {"lambda_tree": 4.0},
    "lambda_tree 64": {"lambda_tree": 64.0},
    "training trees at T = 0.3": {"temperature": 0.3},
    "training trees of budget 64": {"budget": 64},
    "lr 3e-4": {"lr": 3e-4},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="runs/exittrain-diagnosis.json")
    parser.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    args = parser.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    bundle = load_bundle(pair=DEFAULT_PAIR.name, dtype="float32")
    data = load_chat_exittrain_data()
    reference_trees = {}
    for name, change in VARIANTS.items():
        if name in results or (args.only and name not in args.only):
            continue
        config = dataclasses.replace(REFERENCE, steps=args.steps, **change)
        experiment = live_experiment(bundle, config, data)
        # the held-out rounds are scored at the variant's temperature and budget, before and after
        key = (config.temperature, config.budget)
        if key not in reference_trees:
            for _ in experiment.measure_before():
                pass
            reference_trees[key] = experiment.before
        experiment.before = before = reference_trees[key]
        start = time.time()
        for _ in with_progress(experiment.train(), name):
            pass
        for _ in experiment.measure_after():
            pass
        horizon = experiment.drafter.config.horizon
        results[name] = {"settings": dataclasses.asdict(config), "seconds": time.time() - start, **experiment.change(),
                         "mass_before": before.exit_mass_by_depth(horizon), "mass_after": experiment.after.exit_mass_by_depth(horizon)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
        r = results[name]
        print(f"{name}: 1 + C {r['before']:.3f} -> {r['after']:.3f} ({100 * r['change']:+.2f}% +- {100 * r['change_se']:.2f}%), "
              f"root exit {r['mass_before']['internal'][0]:.3f} -> {r['mass_after']['internal'][0]:.3f}", flush=True)


if __name__ == "__main__":
    main()
