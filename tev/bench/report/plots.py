"""The report's plots, one PNG each (matplotlib's object API: no pyplot state, no GUI backend)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from tev.bench.report.common import rows_of
from tev.bench.e2e import stage_names
from tev.util.stored import TAU, rows_figure

__all__ = ["write_plots", "plot_exit_depths", "plot_mass_by_depth", "plot_exittrain_mass", "plot_budget_sweep", "plot_tau_by_method", "plot_stage_times"]


def _save(plots_dir: Path, name: str, figure: Figure) -> str:
    """Write ``name.png``; returns its path relative to the report (``plots/name.png``)."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(plots_dir / f"{name}.png", dpi=110)
    return f"{plots_dir.name}/{name}.png"


def plot_exit_depths(profile: dict, plots_dir: Path) -> str:
    """Bars per depth: TEV's empirical exit-depth frequency vs the exit law summed by depth."""
    depths = list(range(len(profile["exit_law"])))
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.bar([d - 0.2 for d in depths], profile["tev_exit_frequency"], 0.4, label="TEV exits (empirical)")
    ax.bar([d + 0.2 for d in depths], profile["exit_law"], 0.4, label="exit law w by depth")
    ax.set_xticks(depths)
    ax.set_xlabel("exit depth")
    ax.set_ylabel("probability")
    ax.set_title("Exit depth: TEV draws vs the exit law")
    ax.legend()
    return _save(plots_dir, "exit_depth", fig)


def plot_mass_by_depth(profile: dict, trees: int, plots_dir: Path) -> str:
    """Stacked bars per depth: reach that continues deeper and missing mass w leaving there
    (means over ``trees`` real trees)."""
    depths = list(range(len(profile["reach"])))
    exits = profile["exit_law"]
    continues = [0.0] + [max(0.0, profile["reach"][d] - exits[d]) for d in depths[1:]]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.bar(depths, continues, color="#3b7dd8", label="continues deeper")
    ax.bar(depths, exits, bottom=continues, color="#d62728", label="missing mass w")
    ax.set_xticks(depths)
    ax.set_xlabel("depth d")
    ax.set_ylabel("target probability")
    ax.set_title(f"Mass by depth (mean of {trees} real trees)")
    ax.legend()
    return _save(plots_dir, "mass_by_depth", fig)


def plot_budget_sweep(sweep: dict, drafters: list[str], plots_dir: Path) -> str:
    """Lines vs B: tau, mean 1 + C and speedup, one line per (drafter, T)."""
    panels = (("tau", "tau"), ("tau_bound", "mean 1 + C"), ("speedup", "speedup over AR"))
    fig = Figure(figsize=(13, 4))
    axes = fig.subplots(1, 3)
    for drafter in drafters:
        for t in sorted({r["temperature"] for r in rows_of(sweep, drafter)}):
            rows = sorted((r for r in rows_of(sweep, drafter) if r["temperature"] == t), key=lambda r: r["budget"])
            budgets = [r["budget"] for r in rows]
            for ax, (key, _) in zip(axes, panels):
                ax.plot(budgets, [r[key] for r in rows], marker="o", label=f"{drafter} T={t:g}")
    for ax, (_, title) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget B")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    return _save(plots_dir, "budget_sweep", fig)


def plot_tau_by_method(e2e: dict, plots_dir: Path) -> str:
    """Bars: tau per method, grouped by temperature."""
    temps = sorted({r["temperature"] for r in e2e["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in e2e["rows"]))
    key = rows_figure(e2e["rows"])  # rows measured before tau counted tokens per forward hold only the mean block length
    current = key == TAU
    tau = {(r["temperature"], r["method"]): r[key] for r in e2e["rows"]}
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(temps))
    for i, t in enumerate(temps):
        xs = [j + i * width for j, m in enumerate(methods) if (t, m) in tau]
        ax.bar(xs, [tau[(t, m)] for m in methods if (t, m) in tau], width, label=f"T = {t:g}")
    ax.set_xticks([j + width * (len(temps) - 1) / 2 for j in range(len(methods))], methods, rotation=20, ha="right")
    figure = "tau" if current else "mean block length"
    ax.set_ylabel("tau (tokens emitted per target forward)" if current else "mean block length (accepted + bonus)")
    ax.set_title(f"{figure} by method, B = {e2e['rows'][0]['budget']}")
    ax.legend()
    return _save(plots_dir, "tau_by_method", fig)


def plot_stage_times(e2e: dict, plots_dir: Path) -> str:
    """Stacked bars: ms per round for each stage, per speculative method and T."""
    rows = [r for r in e2e["rows"] if r["method"] != "autoregressive"]
    labels = [f"{r['method']} T={r['temperature']:g}" for r in rows]
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    bottom = [0.0] * len(rows)
    for stage in stage_names(e2e):  # as the file names them (an older file: tree_build, verify, verify_decision)
        values = [r["stage_ms_per_round"][stage] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("ms per round")
    ax.set_title("Stage time per round")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=8)
    return _save(plots_dir, "stage_times", fig)


def plot_exittrain_mass(trees: dict, plots_dir: Path) -> str:
    """Per depth, one bar per ablation drafter: the missing mass (solid) and the mass that
    reached a leaf (pale) on the same held-out rounds."""
    names = list(trees)
    depths = [d for d in range(len(trees[names[0]]["internal"])) if any(trees[n]["internal"][d] + trees[n]["leaf"][d] > 1e-3 for n in names)]
    width = 0.8 / len(names)
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    for i, name in enumerate(names):
        x = [d - 0.4 + width * (i + 0.5) for d in depths]
        internal = [trees[name]["internal"][d] for d in depths]
        bars = ax.bar(x, internal, width, label=f"{name} (1 + C = {trees[name]['tau_bound']:.3f})")
        ax.bar(x, [trees[name]["leaf"][d] for d in depths], width, bottom=internal, color=bars.patches[0].get_facecolor(), alpha=0.35)
    ax.set_xticks(depths)
    ax.set_xlabel("depth of the exit node")
    ax.set_ylabel("mean exit probability per tree")
    ax.set_title("Where the target's mass leaves the trees (solid: missing; pale: tree ended)")
    ax.legend(fontsize=8)
    return _save(plots_dir, "exittrain_mass", fig)


def write_plots(measurements: dict, drafters: list[str], plots_dir: Path) -> dict:
    """Every plot as a PNG; returns ``{name: "plots/name.png"}`` (paths relative to the report)."""
    profile = measurements["depth_profile"]
    trees = (measurements.get("exittrain") or {}).get("heldout_trees")
    extra = {"exittrain_mass": plot_exittrain_mass(trees, plots_dir)} if trees else {}
    return extra | {
        "exit_depth": plot_exit_depths(profile, plots_dir),
        "mass_by_depth": plot_mass_by_depth(profile, len(measurements["exit_law"]["trees"]), plots_dir),
        "budget_sweep": plot_budget_sweep(measurements["sweep"], drafters, plots_dir),
        "tau_by_method": plot_tau_by_method(measurements["e2e"], plots_dir),
        "stage_times": plot_stage_times(measurements["e2e"], plots_dir),
    }
