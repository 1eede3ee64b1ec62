"""``python -m tev bench report``: the paper's claims checked on one model pair.

``p`` is the target and ``q`` the drafter, as everywhere. The report runs, on one
``ModelBundle``:

1. the exit law (Lemma 1) on real trees: ``sum_v w(v) = 1``, conservation, and TEV's
   exit-node frequencies against ``w`` (pooled chi-square);
2. the coverage bound (Theorem 1): mean block length of each saturated verifier against
   ``1 + C(T)``, and a deliberately non-saturated exact verifier that stays below it;
3. fixed-tree equivalence (Table 4): the three verifiers' ``tau`` on identical trees;
4. the verifier-stage latency (Table 3): decision + cache commit, TEV vs predraw;
5. the ExitTrain gain and ablation order (Tables 1 and 2);
6. the budget sweep (Table 5);
7. end-to-end speed against autoregressive decoding.

Each claim gets a row ``claim | paper's figure | this run's figure | holds?`` decided by a
rule stated in the row's ``rule`` (never tuned to pass). Timing comparisons interleave their
methods in one run (shuffled order per repeat) and report medians with the IQR.
:func:`build_report` writes ``report.md``, ``report.json`` and PNG + HTML plots.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tev.util.paths import REPO_ROOT
from tqdm import tqdm

from tev.bench.benchmarks import _time_once, bench_e2e, bench_verifiers, fit_prompt, format_e2e_table, format_verifier_table
from tev.engine.drafters import DraftContext
from tev.core.flow import flow_from_edge_prob
from tev.bench.lab import LabResult, LabTree, run_lab, tree_from_prompt
from tev.engine.session import CausalLMSession
from tev.util.timing import machine_info, median, quantile
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows, verify_rows

__all__ = ["ReportSettings", "QUICK", "FULL", "build_report", "report_command"]

SATURATED = ("tev", "predraw", "sequential")
HOLDS = ("yes", "partly", "no", "n/a")  # partly: the direction holds, the size does not
ERROR_LIMIT = 1e-5  # claim 1: float32 flow arithmetic stays far below this
ALPHA = 1e-3  # claim 1: chi-square p-value threshold
Z_LIMIT = 4.0  # claims 2 and 3: allowed standard errors
EQUIVALENCE_MARGIN = 0.03  # claim 3: the paper's Table 4 tolerance
PAPER_LATENCY = {32: -0.129, 64: -0.152, 128: -0.243}  # Table 3, TEV / predraw - 1 at T = 0.6
PAPER_EXITTRAIN_GAIN = 0.13  # Table 1, average relative tau gain
ABLATION = ("base", "none", "prefix", "exit")


@dataclass(frozen=True)
class ReportSettings:
    """How much the report measures. ``QUICK`` takes a couple of minutes on small models."""

    num_prompts: int = 8
    tree_budget: int = 32  # claims 1-3: B of the real trees
    tree_temperature: float = 1.0
    cuts: tuple[float, ...] = (1 / 3, 2 / 3, 1.0)  # prompt prefixes (fractions of its tokens)
    draws: int = 1000  # per tree and verifier
    latency_budgets: tuple[int, ...] = (32, 64, 128)
    latency_temperature: float = 0.6  # the paper's Table 3 setting
    latency_prompts: int = 4
    latency_repeats: int = 25
    synthetic_vocab: int = 151936
    synthetic_repeats: int = 10  # 0 skips the synthetic decision-stage benchmark
    sweep_budgets: tuple[int, ...] = (8, 16, 32, 64, 128)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    e2e_budget: int = 32
    max_new_tokens: int = 64
    e2e_repeats: int = 1


FULL = ReportSettings()
QUICK = ReportSettings(
    num_prompts=3, cuts=(0.5, 1.0), draws=300, latency_prompts=2, latency_repeats=8, synthetic_repeats=0, sweep_budgets=(8, 16), max_new_tokens=16
)


# --------------------------------------------------------------------------- small helpers
def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _clean(value):
    """JSON-safe copy: NaN / infinity become None, tuples lists, tensors numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _spread(values) -> dict:
    """Median and interquartile range of a list of numbers."""
    return {"median": median(values), "q25": quantile(values, 0.25), "q75": quantile(values, 0.75), "n": len(values)}


def _shown_source(source: str) -> str:
    """A model folder inside this repository as a relative path (the report is committed)."""
    root = REPO_ROOT
    path = Path(source)
    if path.is_dir() and root in path.resolve().parents:
        return str(path.resolve().relative_to(root))
    return source


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if _finite(x) else "n/a"


def _claim(number: int, name: str, paper: str, this_run: str, value, holds: str, rule: str, figures: dict | None = None) -> dict:
    """One row of the claims table."""
    assert holds in HOLDS, holds
    return {"id": number, "claim": name, "paper": paper, "this_run": this_run, "value": value, "holds": holds, "rule": rule, "figures": figures or {}}


def _yes(condition: bool) -> str:
    return "yes" if condition else "no"


# --------------------------------------------------------------------------- real trees (claims 1-3)
def prompt_cuts(ids: list[int], cuts) -> list[int]:
    """Prefix lengths of ``ids`` at the given fractions (at least 2 tokens, distinct)."""
    lengths = {min(len(ids), max(2, round(f * len(ids)))) for f in cuts}
    return sorted(lengths)


def real_trees(bundle, drafter, encoded: list[tuple[str, list[int]]], settings: ReportSettings, progress: bool) -> list[dict]:
    """First-round trees (``B = settings.tree_budget``) on every prompt and prompt prefix.

    Returns ``[{"prompt", "length", "lab": LabTree}]``.
    """
    jobs = [(pid, ids[:k]) for pid, ids in encoded for k in prompt_cuts(ids, settings.cuts)]
    trees = []
    for pid, ids in tqdm(jobs, desc="real trees", disable=not progress):
        lab = tree_from_prompt(bundle.target, drafter, ids, settings.tree_budget, settings.tree_temperature)
        trees.append({"prompt": pid, "length": len(ids), "lab": lab})
    return trees


def run_labs(trees: list[dict], draws: int, seed: int, progress: bool) -> list[LabResult]:
    """Every saturated verifier ``draws`` times on each tree (seeded per tree)."""
    return [run_lab(t["lab"], verifiers=SATURATED, draws=draws, seed=seed + i) for i, t in enumerate(tqdm(trees, desc="verifier lab", disable=not progress))]


def reference_exit_law(lab: LabTree) -> torch.Tensor:
    """`Tensor[N]` float64 ``w(v)`` by walking each path from the full rows ``p_v``
    (independent of :mod:`tev.core.flow`; a loop over nodes is fine for a check)."""
    p = lab.rows.all_rows().double().cpu()
    tree = lab.tree
    reach = torch.ones(tree.num_nodes, dtype=torch.float64)
    for v in range(1, tree.num_nodes):
        reach[v] = reach[tree.parents_list[v]] * p[tree.parents_list[v], tree.tokens_list[v]]
    child_mass = torch.zeros(tree.num_nodes, dtype=torch.float64).index_add_(0, tree.parents[1:], p[tree.parents[1:], tree.tokens[1:]])
    return reach * (1.0 - child_mass)


def exit_law_errors(lab: LabTree) -> dict:
    """``|sum w - 1|``, max conservation error ``|w(v) + sum_{u in Ch(v)} P(u) - P(v)|``, and
    max ``|w - w_ref|`` against the float64 reference."""
    flow = lab.flow
    reach, w = flow.reach.double().cpu(), flow.exit_weight.double().cpu()
    parents = lab.tree.parents[1:]
    children_reach = torch.zeros_like(reach).index_add_(0, parents, reach[1:])
    return {
        "sum_error": abs(float(w.sum()) - 1.0),
        "conservation_error": float((w + children_reach - reach).abs().max()),
        "reference_error": float((w - reference_exit_law(lab)).abs().max()),
    }


def chi_square_cells(counts: list[int], weights: list[float], min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and dof of ``counts`` against ``weights`` (normalised); cells
    with expected count below ``min_expected`` are pooled into one cell."""
    n = sum(counts)
    total = sum(weights)
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for count, weight in zip(counts, weights):
        e = n * weight / total
        if e >= min_expected:
            observed.append(count)
            expected.append(e)
        else:
            pooled_o += count
            pooled_e += e
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    elif pooled_o > 0:
        return float("inf"), max(1, len(observed))  # draws where the law puts no mass
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return statistic, len(observed) - 1


def pooled_chi_square(trees: list[dict], results: list[LabResult], verifier: str) -> dict:
    """Per-tree chi-square of exit-node counts against ``w``, summed over trees."""
    from scipy.stats import chi2

    statistic, dof, draws = 0.0, 0, 0
    for tree, result in zip(trees, results):
        counts = [round(f * result.draws) for f in result.frequencies[verifier]]
        s, d = chi_square_cells(counts, tree["lab"].flow.exit_weight.double().cpu().tolist())
        statistic, dof, draws = statistic + s, dof + d, draws + sum(counts)
    p_value = float(chi2.sf(statistic, dof)) if dof > 0 and math.isfinite(statistic) else (1.0 if dof == 0 else 0.0)
    return {"verifier": verifier, "draws": draws, "statistic": statistic, "dof": dof, "p_value": p_value}


def check_exit_law(trees: list[dict], results: list[LabResult]) -> tuple[dict, dict]:
    """Claim 1: the exit law on real trees."""
    errors = [exit_law_errors(t["lab"]) for t in trees]
    worst = {key: max(e[key] for e in errors) for key in errors[0]}
    tests = {name: pooled_chi_square(trees, results, name) for name in SATURATED}
    tev = tests["tev"]
    holds = all(v < ERROR_LIMIT for v in worst.values()) and tev["p_value"] > ALPHA
    this_run = (
        f"{len(trees)} trees: max abs(sum w - 1) = {worst['sum_error']:.1e}, max conservation error = {worst['conservation_error']:.1e}; "
        f"TEV exits vs w: chi2 = {tev['statistic']:.1f}, dof {tev['dof']}, p = {tev['p_value']:.3g} ({tev['draws']} draws)"
    )
    claim = _claim(
        1, "Exit law (Lemma 1)", "sum_v w(v) = 1; w(v) + sum_children P(u) = P(v); Pr(exit = v) = w(v)", this_run, tev["p_value"], _yes(holds),
        f"yes if max abs(sum w - 1), the max conservation error abs(w(v) + sum_children P(u) - P(v)) and max abs(w - w_ref) against a float64 path walk are all < {ERROR_LIMIT:g} and the pooled chi-square p-value of TEV's exit nodes against w is > {ALPHA:g}",
        {**worst, "chi2_statistic": tev["statistic"], "chi2_dof": tev["dof"], "chi2_p_value": tev["p_value"], "draws": tev["draws"]},
    )
    details = {"trees": [{"prompt": t["prompt"], "length": t["length"], "nodes": t["lab"].tree.num_nodes, **e} for t, e in zip(trees, errors)], "worst": worst, "chi_square": tests}
    return claim, details


def pooled_length(results: list[LabResult], verifier: str) -> tuple[float, float]:
    """Mean block length over trees (equal draws each) and its standard error."""
    means = [r.mean_lengths[verifier] for r in results]
    se = math.sqrt(sum(r.length_se[verifier] ** 2 for r in results)) / len(results)
    return sum(means) / len(means), se


def first_child_chain(lab: LabTree) -> LabTree:
    """The tree restricted to its first-child chain (root, its first child, that node's first
    child, ...), with the matching target rows: an exact verifier that is not saturated."""
    nodes = [0]
    while lab.tree.children(nodes[-1]):
        nodes.append(lab.tree.children(nodes[-1])[0])
    tree = DraftTree.from_parents([lab.tree.tokens_list[v] for v in nodes], [-1] + list(range(len(nodes) - 1)))
    index = torch.tensor(nodes, device=lab.rows.device)
    if lab.rows.hidden is not None:
        rows = TargetRows(hidden=lab.rows.hidden.index_select(0, index), head=lab.rows.head, temperature=lab.rows.temperature)
    elif lab.rows.logits is not None:
        rows = TargetRows(logits=lab.rows.logits.index_select(0, index), temperature=lab.rows.temperature)
    else:
        rows = TargetRows(lab.rows.probs.index_select(0, index))
    return LabTree(tree, rows, flow_from_edge_prob(tree, rows.edge_prob(tree)), "first-child chain")


def check_coverage_bound(trees: list[dict], results: list[LabResult], draws: int, seed: int) -> tuple[dict, dict]:
    """Claim 2: E[L] = 1 + C(T) for the saturated verifiers; a non-saturated exact one stays below."""
    bound = sum(t["lab"].flow.tau_bound for t in trees) / len(trees)
    verifiers = {}
    for name in SATURATED:
        mean, se = pooled_length(results, name)
        verifiers[name] = {"mean_length": mean, "se": se, "diff": mean - bound, "z": (mean - bound) / se if se > 0 else (0.0 if mean == bound else float("inf"))}
    chains = [first_child_chain(t["lab"]) for t in trees]
    chain_results = [run_lab(c, verifiers=("tev",), draws=draws, seed=seed + 10_000 + i) for i, c in enumerate(chains)]
    chain_mean, chain_se = pooled_length(chain_results, "tev")
    chain = {"mean_length": chain_mean, "se": chain_se, "own_bound": sum(c.flow.tau_bound for c in chains) / len(chains), "full_bound": bound, "gap": bound - chain_mean}
    saturated_ok = all(abs(v["z"]) < Z_LIMIT for v in verifiers.values())
    holds = saturated_ok and chain_mean < bound
    worst_z = max(abs(v["z"]) for v in verifiers.values())
    this_run = (
        f"mean 1 + C = {bound:.4f}; mean L: " + ", ".join(f"{n} {v['mean_length']:.4f} ({v['z']:+.1f} s.e.)" for n, v in verifiers.items())
        + f"; first-child-chain TEV {chain_mean:.4f} +- {chain_se:.4f} (below by {chain['gap']:.4f})"
    )
    claim = _claim(
        2, "Coverage bound (Theorem 1)", "E[L] <= 1 + C(T), with equality for TEV, predraw, sequential", this_run, worst_z, _yes(holds),
        f"yes if abs(mean L - mean(1 + C)) < {Z_LIMIT:g} s.e. for each of tev, predraw, sequential (pooled over trees and draws) and TEV on the first-child chain has mean L < the full trees' mean 1 + C",
        {"mean_tau_bound": bound, "max_abs_z": worst_z, **{f"{n}_mean_length": v["mean_length"] for n, v in verifiers.items()}, "chain_mean_length": chain_mean, "chain_gap": chain["gap"]},
    )
    return claim, {"trees": len(trees), "draws_per_tree": draws, "mean_tau_bound": bound, "verifiers": verifiers, "first_child_chain": chain}


def check_equivalence(coverage: dict) -> dict:
    """Claim 3: the verifiers' tau on identical trees agree within 0.03 + 4 s.e."""
    v = coverage["verifiers"]
    pairs = []
    for i, a in enumerate(SATURATED):
        for b in SATURATED[i + 1 :]:
            diff = abs(v[a]["mean_length"] - v[b]["mean_length"])
            se = math.hypot(v[a]["se"], v[b]["se"])
            pairs.append({"pair": f"{a} vs {b}", "diff": diff, "se": se, "limit": EQUIVALENCE_MARGIN + Z_LIMIT * se})
    worst = max(pairs, key=lambda p: p["diff"])
    holds = all(p["diff"] < p["limit"] for p in pairs)
    claim = _claim(
        3, "Fixed-tree equivalence (Table 4)", "tau within 0.03 across verifiers", f"max abs(tau difference) = {worst['diff']:.4f} +- {worst['se']:.4f} ({worst['pair']})",
        worst["diff"], _yes(holds), f"yes if every pairwise abs(tau_a - tau_b) < {EQUIVALENCE_MARGIN} + {Z_LIMIT:g} s.e. of the difference",
        {"max_diff": worst["diff"], "max_diff_se": worst["se"]},
    )
    claim["pairs"] = pairs
    return claim


# --------------------------------------------------------------------------- latency (claim 4)
@dataclass(eq=False)
class CommitCase:
    """A real tree after its target forward, with a clone of the cache to restore before each
    timed commit."""

    session: CausalLMSession
    tree: DraftTree
    rows: TargetRows
    snapshot: list[tuple[torch.Tensor, torch.Tensor]]
    length: int

    def restore(self) -> None:
        """Put back the cache as it was right after ``forward_tree`` (not timed)."""
        for layer, (keys, values) in zip(self.session.cache.layers, self.snapshot):
            layer.keys, layer.values = keys, values  # commit never writes in place
        self.session.length = self.length


def commit_case(target, drafter, ids: list[int], budget: int, temperature: float) -> CommitCase:
    """Prefill ``ids`` minus its last token, draft a ``budget`` tree, run the tree forward."""
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    features = session.extend(ids[:-1]).features if len(ids) > 1 else None
    room = session.max_positions - 1 - session.length
    tree = drafter.propose(DraftContext(list(ids), features, max_depth=room), budget, drafter.new_state())
    rows = session.forward_tree(tree).rows(temperature)  # the head runs inside the decision stage, as in decoding
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in session.cache.layers]
    return CommitCase(session, tree, rows, snapshot, session.length)


def time_stage(case: CommitCase, name: str, generator: torch.Generator, device) -> tuple[float, float]:
    """(decision seconds, commit seconds) of one verifier on one case."""
    verdicts = []
    decision = _time_once(lambda: verdicts.append(verify_rows(name, case.tree, case.rows, generator)), device)
    case.restore()
    commit = _time_once(lambda: case.session.commit(verdicts[0].path), device)
    case.restore()
    return decision, commit


def bench_verifier_stage(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> list[dict]:
    """Decision + commit time, TEV vs predraw, on the same real trees per budget, interleaved."""
    device = next(bundle.target.parameters()).device
    order_rng = random.Random(seed)
    names = ("tev", "predraw")
    rows = []
    prompts = [ids for _, ids in encoded[: settings.latency_prompts]]
    for budget in tqdm(settings.latency_budgets, desc="verifier stage", disable=not progress):
        cases = [commit_case(bundle.target, drafter, ids, budget, settings.latency_temperature) for ids in prompts]
        generator = torch.Generator(device=device).manual_seed(seed)
        times = {n: {"decision": [], "commit": [], "total": []} for n in names}
        for case in cases:  # warm-up
            for name in names:
                time_stage(case, name, generator, device)
        for _ in range(settings.latency_repeats):
            for case in cases:
                order = list(names)
                order_rng.shuffle(order)
                for name in order:
                    decision, commit = time_stage(case, name, generator, device)
                    times[name]["decision"].append(decision)
                    times[name]["commit"].append(commit)
                    times[name]["total"].append(decision + commit)
        row = {"budget": budget, "nodes": [c.tree.num_nodes for c in cases], "samples": len(times["tev"]["total"])}
        for name in names:
            row[name] = {stage: _spread(values) for stage, values in times[name].items()}
        row["relative_change"] = row["tev"]["total"]["median"] / row["predraw"]["total"]["median"] - 1
        row["decision_relative_change"] = row["tev"]["decision"]["median"] / row["predraw"]["decision"]["median"] - 1
        rows.append(row)
    return rows


def check_latency(stage_rows: list[dict], synthetic: dict | None) -> dict:
    """Claim 4: TEV's verifier stage (decision + commit) is faster than predraw's."""
    changes = {r["budget"]: r["relative_change"] for r in stage_rows}
    holds = all(c < 0 for c in changes.values())
    paper = " / ".join(_pct(PAPER_LATENCY[b]) for b in sorted(PAPER_LATENCY)) + " at B = 32 / 64 / 128, T = 0.6"
    this_run = ", ".join(f"B={b}: {_pct(c)}" for b, c in changes.items()) + " (real trees, decision + commit, medians)"
    if synthetic:
        this_run += "; synthetic decision stage: " + ", ".join(f"B={r['budget']} V={r['vocab']}: {_pct(r['tev_over_predraw'] - 1)}" for r in synthetic["rows"])
    return _claim(
        4, "TEV verifier-stage latency (Table 3)", paper, this_run, max(changes.values()), _yes(holds),
        "yes if TEV's median decision + commit time is below predraw's (TEV / predraw - 1 < 0) at every measured budget; the paper's magnitudes are shown, not required",
        {f"relative_change_B{b}": c for b, c in changes.items()},
    )


# --------------------------------------------------------------------------- ExitTrain, sweep, e2e (claims 5-7)
def _rows_of(result: dict, prefix: str) -> list[dict]:
    """bench_e2e rows of one drafter (``"block"`` matches ``block+tev`` and ``block+greedy``)."""
    return [r for r in result["rows"] if r["method"].split("+")[0] == prefix]


def exittrain_from_results(results: dict) -> dict:
    """Per (budget, T): tau per ablation drafter, the exit-vs-base gain, and the mean order."""
    settings: dict[tuple, dict] = {}
    for row in results.get("rows", []):
        if row.get("drafter") in ABLATION and _finite(row.get("tau")):
            settings.setdefault((row["budget"], row["temperature"]), {})[row["drafter"]] = row["tau"]
    table = []
    for (budget, temperature), taus in sorted(settings.items()):
        gain = taus["exit"] / taus["base"] - 1 if "exit" in taus and "base" in taus else float("nan")
        table.append({"budget": budget, "temperature": temperature, **taus, "gain": gain})
    common = [r for r in table if all(k in r for k in ABLATION)]
    means = {k: sum(r[k] for r in common) / len(common) for k in ABLATION} if common else {}
    gains = [r["gain"] for r in table if _finite(r["gain"])]
    return {"source": "--exittrain-results", "settings": table, "mean_gain": sum(gains) / len(gains) if gains else float("nan"), "mean_tau": means}


def exittrain_from_sweep(sweep: dict) -> dict:
    """Per (budget, T): base ("block") vs ExitTrain tau from the budget sweep."""
    base = {(r["budget"], r["temperature"]): r["tau"] for r in _rows_of(sweep, "block")}
    table = []
    for r in _rows_of(sweep, "exittrain"):
        key = (r["budget"], r["temperature"])
        if key in base:
            table.append({"budget": key[0], "temperature": key[1], "base": base[key], "exit": r["tau"], "gain": r["tau"] / base[key] - 1})
    gains = [r["gain"] for r in table]
    return {"source": "budget sweep (block vs exittrain drafter)", "settings": table, "mean_gain": sum(gains) / len(gains) if gains else float("nan"), "mean_tau": {}}


def check_exittrain(data: dict | None) -> dict:
    """Claim 5: ExitTrain's average tau gain, and the ablation order when measured."""
    paper = f"{_pct(PAPER_EXITTRAIN_GAIN)} average tau (Table 1); exit > none > base, prefix < exit (Table 2)"
    if data is None or not data["settings"]:
        return _claim(5, "ExitTrain gain and ablation order (Tables 1-2)", paper, "not run (pass --exittrain-results)", None, "n/a", "n/a: no ExitTrain results and no exittrain drafter")
    gain = data["mean_gain"]
    means = data["mean_tau"]
    size_rule = f"; partly when it does but the gain is under half the paper's ({_pct(PAPER_EXITTRAIN_GAIN / 2)})"
    if means:
        order = means["exit"] > means["none"] > means["base"] and means["prefix"] < means["exit"]
        common = [r for r in data["settings"] if all(k in r for k in ABLATION)]
        beats = {k: sum(r["exit"] > r[k] for r in common) for k in ("none", "prefix")}
        order_text = (
            "; mean tau " + ", ".join(f"{k} {means[k]:.3f}" for k in ("exit", "none", "prefix", "base")) + f" (order {'holds' if order else 'fails'}); "
            f"exit beats none in {beats['none']} and prefix in {beats['prefix']} of {len(common)} settings"
        )
        rule = "yes if the mean relative tau gain of exit over base is > 0 and the mean tau (over settings with all four) orders exit > none > base and prefix < exit" + size_rule
    else:
        order, order_text = True, "; ablation order not measured (no setting has all of base, none, prefix, exit)"
        rule = "yes if the mean relative tau gain of exit (the ExitTrain drafter) over base is > 0; the ablation order is not measured here" + size_rule
    holds = _finite(gain) and gain > 0 and order
    verdict = ("yes" if gain >= PAPER_EXITTRAIN_GAIN / 2 else "partly") if holds else "no"
    this_run = f"{_pct(gain)} average tau over {len(data['settings'])} settings ({data['source']})" + order_text
    return _claim(5, "ExitTrain gain and ablation order (Tables 1-2)", paper, this_run, gain, verdict, rule, {"mean_gain": gain, **{f"mean_tau_{k}": v for k, v in means.items()}})


def check_sweep(sweep: dict, drafters: list[str]) -> dict:
    """Claim 6: tau and mean 1 + C grow from the smallest to the largest budget."""
    parts, margins = [], []
    for drafter in drafters:
        for temperature in sorted({r["temperature"] for r in _rows_of(sweep, drafter)}):
            rows = sorted((r for r in _rows_of(sweep, drafter) if r["temperature"] == temperature), key=lambda r: r["budget"])
            if len(rows) < 2:
                continue
            low, high = rows[0], rows[-1]
            margins.append(min(high["tau"] - low["tau"], high["tau_bound"] - low["tau_bound"]))
            best = max(rows, key=lambda r: r["speedup"])
            parts.append(
                f"{drafter} T={temperature:g}: tau {low['tau']:.2f}->{high['tau']:.2f}, 1+C {low['tau_bound']:.2f}->{high['tau_bound']:.2f} "
                f"(B {low['budget']}->{high['budget']}), best speedup {best['speedup']:.2f}x at B={best['budget']}"
            )
    rule = "yes if, for every drafter and T, both tau and mean 1 + C at the largest budget exceed their values at the smallest budget"
    if not margins:
        return _claim(6, "Budget sweep (Table 5)", "tau, 1 + C and speedup vs B", "not run (fewer than two budgets or no drafter)", None, "n/a", rule)
    return _claim(6, "Budget sweep (Table 5)", "tau and 1 + C rise with B; speedup vs B", "; ".join(parts), min(margins), _yes(min(margins) > 0), rule, {"min_growth": min(margins)})


def check_e2e(e2e: dict, base: str) -> dict:
    """Claim 7: DDTree + TEV beats autoregressive decoding and is at least as fast as predraw."""
    rows = {(r["temperature"], r["method"]): r for r in e2e["rows"]}
    tev, predraw = rows.get((1.0, f"{base}+tev")), rows.get((1.0, f"{base}+predraw"))
    rule = "yes if at T = 1 DDTree+TEV's median speedup over autoregressive is > 1 and its median tokens/s is >= DDTree+predraw's"
    paper = "speedup over AR > 1; TEV at least as fast as predraw end to end"
    if tev is None or predraw is None:
        return _claim(7, "End-to-end speed", paper, "not run (no tree drafter at T = 1)", None, "n/a", rule)
    parts = [f"T={t:g} {m}: {r['tokens_per_second']:.1f} tok/s, {r['speedup']:.2f}x" for (t, m), r in rows.items() if m != "autoregressive"]
    holds = tev["speedup"] > 1 and tev["tokens_per_second"] >= predraw["tokens_per_second"]
    return _claim(
        7, "End-to-end speed", paper, f"B={e2e['rows'][0]['budget']}: " + "; ".join(parts) + " (T = 0: every verifier is greedy)", tev["speedup"], _yes(holds), rule,
        {"tev_speedup": tev["speedup"], "predraw_speedup": predraw["speedup"], "tev_tokens_per_second": tev["tokens_per_second"], "predraw_tokens_per_second": predraw["tokens_per_second"]},
    )


# --------------------------------------------------------------------------- depth profiles
def _pad_mean(vectors: list[list[float]]) -> list[float]:
    size = max(len(v) for v in vectors)
    return [sum(v[d] if d < len(v) else 0.0 for v in vectors) / len(vectors) for d in range(size)]


def depth_profile(trees: list[dict], results: list[LabResult]) -> dict:
    """Per depth, averaged over trees: reach, exit law ``w``, node count, and TEV's empirical
    exit-depth frequency (from the lab draws)."""
    tables = [t["lab"].flow.by_depth() for t in trees]
    empirical = []
    for tree, result in zip(trees, results):
        depths = tree["lab"].tree.depths.tolist()
        row = [0.0] * (max(depths) + 1)
        for v, f in enumerate(result.frequencies["tev"]):
            row[depths[v]] += f
        empirical.append(row)
    return {
        "reach": _pad_mean([t["reach"].tolist() for t in tables]),
        "exit_law": _pad_mean([t["exit"].tolist() for t in tables]),
        "nodes": _pad_mean([t["nodes"].tolist() for t in tables]),
        "tev_exit_frequency": _pad_mean(empirical),
    }


# --------------------------------------------------------------------------- plots
def _save(plots_dir: Path, name: str, mpl_figure, plotly_figure) -> dict:
    """Write ``name.png`` (matplotlib) and ``name.html`` (plotly, JS from the CDN)."""
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    mpl_figure.tight_layout()
    mpl_figure.savefig(plots_dir / f"{name}.png", dpi=110)
    plt.close(mpl_figure)
    plotly_figure.write_html(plots_dir / f"{name}.html", include_plotlyjs="cdn")
    return {"png": f"{plots_dir.name}/{name}.png", "html": f"{plots_dir.name}/{name}.html"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_tau_by_method(e2e: dict, plots_dir: Path) -> dict:
    """Bars: tau per method, grouped by temperature."""
    import plotly.graph_objects as go

    plt = _pyplot()
    temps = sorted({r["temperature"] for r in e2e["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in e2e["rows"]))
    tau = {(r["temperature"], r["method"]): r["tau"] for r in e2e["rows"]}
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(temps))
    for i, t in enumerate(temps):
        xs = [j + i * width for j, m in enumerate(methods) if (t, m) in tau]
        ax.bar(xs, [tau[(t, m)] for m in methods if (t, m) in tau], width, label=f"T = {t:g}")
    ax.set_xticks([j + width * (len(temps) - 1) / 2 for j in range(len(methods))], methods, rotation=20, ha="right")
    ax.set_ylabel("tau (mean block length)")
    ax.set_title(f"tau by method, B = {e2e['rows'][0]['budget']}")
    ax.legend()
    pfig = go.Figure([go.Bar(name=f"T = {t:g}", x=[m for m in methods if (t, m) in tau], y=[tau[(t, m)] for m in methods if (t, m) in tau]) for t in temps])
    pfig.update_layout(barmode="group", title=f"tau by method, B = {e2e['rows'][0]['budget']}", yaxis_title="tau (mean block length)")
    return _save(plots_dir, "tau_by_method", fig, pfig)


def plot_budget_sweep(sweep: dict, drafters: list[str], plots_dir: Path) -> dict:
    """Lines vs B: tau, mean 1 + C and speedup, one line per (drafter, T)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    plt = _pyplot()
    panels = (("tau", "tau"), ("tau_bound", "mean 1 + C"), ("speedup", "speedup over AR"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    pfig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
    for drafter in drafters:
        for t in sorted({r["temperature"] for r in _rows_of(sweep, drafter)}):
            rows = sorted((r for r in _rows_of(sweep, drafter) if r["temperature"] == t), key=lambda r: r["budget"])
            budgets = [r["budget"] for r in rows]
            for col, (key, title) in enumerate(panels):
                axes[col].plot(budgets, [r[key] for r in rows], marker="o", label=f"{drafter} T={t:g}")
                pfig.add_trace(go.Scatter(x=budgets, y=[r[key] for r in rows], name=f"{drafter} T={t:g}", legendgroup=f"{drafter}{t}", showlegend=col == 0), row=1, col=col + 1)
    for ax, (_, title) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget B")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    pfig.update_xaxes(type="log", title_text="budget B")
    pfig.update_layout(title="Budget sweep")
    return _save(plots_dir, "budget_sweep", fig, pfig)


def plot_mass_by_depth(flows: list, profile: dict, plots_dir: Path) -> dict:
    """Stacked bars per depth: reach that continues deeper and missing mass w leaving there."""
    from visual.figures import mass_by_depth_figure

    plt = _pyplot()
    depths = list(range(len(profile["reach"])))
    exits = profile["exit_law"]
    continues = [0.0] + [max(0.0, profile["reach"][d] - exits[d]) for d in depths[1:]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(depths, continues, color="#3b7dd8", label="continues deeper")
    ax.bar(depths, exits, bottom=continues, color="#d62728", label="missing mass w")
    ax.set_xticks(depths)
    ax.set_xlabel("depth d")
    ax.set_ylabel("target probability")
    ax.set_title(f"Mass by depth (mean of {len(flows)} real trees)")
    ax.legend()
    return _save(plots_dir, "mass_by_depth", fig, mass_by_depth_figure(flows))


def plot_exit_depths(profile: dict, plots_dir: Path) -> dict:
    """Bars per depth: TEV's empirical exit-depth frequency vs the exit law summed by depth."""
    import plotly.graph_objects as go

    plt = _pyplot()
    depths = list(range(len(profile["exit_law"])))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([d - 0.2 for d in depths], profile["tev_exit_frequency"], 0.4, label="TEV exits (empirical)")
    ax.bar([d + 0.2 for d in depths], profile["exit_law"], 0.4, label="exit law w by depth")
    ax.set_xticks(depths)
    ax.set_xlabel("exit depth")
    ax.set_ylabel("probability")
    ax.set_title("Exit depth: TEV draws vs the exit law")
    ax.legend()
    pfig = go.Figure([go.Bar(name="TEV exits (empirical)", x=depths, y=profile["tev_exit_frequency"]), go.Bar(name="exit law w by depth", x=depths, y=profile["exit_law"])])
    pfig.update_layout(barmode="group", title="Exit depth: TEV draws vs the exit law", xaxis_title="exit depth", yaxis_title="probability")
    return _save(plots_dir, "exit_depth", fig, pfig)


def plot_stage_times(e2e: dict, plots_dir: Path) -> dict:
    """Stacked bars: ms per round for each stage, per speculative method and T."""
    import plotly.graph_objects as go

    plt = _pyplot()
    stages = ("draft", "tree_build", "verify", "verify_decision", "commit")
    rows = [r for r in e2e["rows"] if r["method"] != "autoregressive"]
    labels = [f"{r['method']} T={r['temperature']:g}" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0.0] * len(rows)
    pfig = go.Figure()
    for stage in stages:
        values = [r["stage_ms_per_round"][stage] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=stage)
        pfig.add_trace(go.Bar(name=stage, x=labels, y=values))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("ms per round")
    ax.set_title("Stage time per round")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=8)
    pfig.update_layout(barmode="stack", title="Stage time per round", yaxis_title="ms per round")
    return _save(plots_dir, "stage_times", fig, pfig)


# --------------------------------------------------------------------------- markdown
def claims_table(claims: list[dict]) -> str:
    """The claims summary as a markdown table."""
    lines = ["| # | claim | paper's figure | this run's figure | holds? |", "|---|---|---|---|---|"]
    for c in claims:
        cells = [str(c["id"]), c["claim"], c["paper"], c["this_run"], f"**{c['holds']}**"]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _image(plots: dict, name: str, caption: str) -> str:
    return f"![{caption}]({plots[name]['png']})  \n[interactive version]({plots[name]['html']})"


def _ms(spread: dict) -> str:
    return f"{1e3 * spread['median']:.3f} ({1e3 * spread['q25']:.3f}-{1e3 * spread['q75']:.3f})"


def _section_exit_law(report: dict) -> list[str]:
    m = report["measurements"]["exit_law"]
    lines = [
        "| verifier | draws | chi2 | dof | p |", "|---|---|---|---|---|",
        *(f"| {t['verifier']} | {t['draws']} | {t['statistic']:.2f} | {t['dof']} | {t['p_value']:.3g} |" for t in m["chi_square"].values()),
        "",
        f"Worst over {len(m['trees'])} trees: |sum w - 1| = {m['worst']['sum_error']:.2e}, conservation error = {m['worst']['conservation_error']:.2e}, "
        f"|w - w_ref| (float64 path walk) = {m['worst']['reference_error']:.2e}.",
        "",
        _image(report["plots"], "exit_depth", "exit depth histogram"),
        "",
        _image(report["plots"], "mass_by_depth", "mass by depth"),
    ]
    return lines


def _section_coverage(report: dict) -> list[str]:
    m = report["measurements"]["coverage"]
    c = m["first_child_chain"]
    return [
        f"{m['trees']} trees x {m['draws_per_tree']} draws per verifier; mean 1 + C = {m['mean_tau_bound']:.4f}.",
        "",
        "| verifier | mean L | s.e. | mean L - (1 + C) | z |", "|---|---|---|---|---|",
        *(f"| {n} | {v['mean_length']:.4f} | {v['se']:.4f} | {v['diff']:+.4f} | {v['z']:+.2f} |" for n, v in m["verifiers"].items()),
        "",
        f"Non-saturated exact verifier (TEV on each tree's first-child chain): mean L = {c['mean_length']:.4f} +- {c['se']:.4f}, "
        f"its own mean 1 + C = {c['own_bound']:.4f}, the full trees' mean 1 + C = {c['full_bound']:.4f} (gap {c['gap']:.4f}).",
    ]


def _section_equivalence(report: dict) -> list[str]:
    claim = report["claims"][2]
    return ["| pair | abs(tau diff) | s.e. | limit (0.03 + 4 s.e.) |", "|---|---|---|---|", *(f"| {p['pair']} | {p['diff']:.4f} | {p['se']:.4f} | {p['limit']:.4f} |" for p in claim["pairs"])]


def _section_latency(report: dict) -> list[str]:
    m = report["measurements"]["latency"]
    lines = [
        f"Real trees at T = {report['settings']['latency_temperature']}, decision + cache commit, interleaved; ms, median (IQR).",
        "",
        "| B | samples | TEV decision | predraw decision | TEV commit | predraw commit | TEV total | predraw total | TEV / predraw - 1 | paper |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in m["real_trees"]:
        lines.append(
            f"| {r['budget']} | {r['samples']} | {_ms(r['tev']['decision'])} | {_ms(r['predraw']['decision'])} | {_ms(r['tev']['commit'])} | "
            f"{_ms(r['predraw']['commit'])} | {_ms(r['tev']['total'])} | {_ms(r['predraw']['total'])} | {_pct(r['relative_change'])} | {_pct(PAPER_LATENCY.get(r['budget'], float('nan')))} |"
        )
    if m["synthetic"]:
        lines += ["", f"Decision stage on synthetic trees at vocabulary {report['settings']['synthetic_vocab']} (tev.bench.benchmarks.bench_verifiers):", "", format_verifier_table(m["synthetic"])]
    else:
        lines += ["", "The synthetic large-vocabulary decision benchmark was skipped (--quick)."]
    return lines


def _section_exittrain(report: dict) -> list[str]:
    data = report["measurements"]["exittrain"]
    if not data or not data["settings"]:
        return ["Not run: pass `--exittrain-results PATH` (written by `python -m tev bench exittrain`) or ship an `exittrain` drafter."]
    keys = [k for k in ABLATION if any(k in r for r in data["settings"])]
    lines = [f"Source: {data['source']}.", "", "| B | T | " + " | ".join(f"tau {k}" for k in keys) + " | exit / base - 1 |", "|---|---|" + "---|" * (len(keys) + 1)]
    for r in data["settings"]:
        lines.append(f"| {r['budget']} | {r['temperature']:g} | " + " | ".join(f"{r[k]:.3f}" if k in r else "-" for k in keys) + f" | {_pct(r['gain'])} |")
    return lines


def _section_e2e(report: dict, key: str) -> list[str]:
    result = report["measurements"][key]
    return [f"{result['prompts']} prompts x {result['repeats']} repeats, {result['max_new_tokens']} new tokens, methods interleaved with an autoregressive run; median (IQR).", "", format_e2e_table(result)]


def render_markdown(report: dict) -> str:
    """report.md: title, command, machine, the claims table, one section per claim."""
    info = report["machine"]
    machine = f"{info['cpu']}, {info['torch_threads']} torch threads ({info['cpu_count']} CPUs), torch {info['torch']}, device {info['device']}" + (f" ({info['gpu']})" if "gpu" in info else "")
    sections = {
        1: _section_exit_law(report), 2: _section_coverage(report), 3: _section_equivalence(report), 4: _section_latency(report),
        5: _section_exittrain(report), 6: _section_e2e(report, "sweep") + ["", _image(report["plots"], "budget_sweep", "budget sweep")],
        7: _section_e2e(report, "e2e") + ["", _image(report["plots"], "tau_by_method", "tau by method"), "", _image(report["plots"], "stage_times", "stage times")],
    }
    lines = [
        "# TEV Explorer: the paper's claims on this model pair", "",
        f"- command: `{report['command']}`", f"- machine: {machine}", f"- target: `{report['target']}`; drafters: {', '.join(report['drafters'])}",
        f"- seed: {report['seed']}; mode: {'quick' if report['quick'] else 'full'}; prompts: {len(report['prompts'])}", f"- date: {report['date']}", "",
        "## Claims", "", claims_table(report["claims"]), "",
    ]
    for claim in report["claims"]:
        verdict = {"yes": "It holds in this run.", "no": f"It does not hold in this run: {claim['this_run']}.", "partly": f"It holds in direction, not in size: {claim['this_run']}.", "n/a": "Not decided in this run."}[claim["holds"]]
        lines += [f"## {claim['id']}. {claim['claim']}", "", f"Paper: {claim['paper']}. Rule: {claim['rule']}. {verdict}", "", *sections[claim["id"]], ""]
    lines += [
        "## How to run on a CUDA GPU", "",
        "Run the same command on a machine with CUDA (`--device auto` picks it; `--dtype` defaults to bfloat16 there). "
        "Verifier-stage timings then use CUDA events and end-to-end stage timings synchronise around each stage, as `tev.bench.benchmarks` does.", "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the report
def measure_trees(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> tuple[list[dict], dict]:
    """Claims 1-3 on real trees: returns (claims, measurements incl. the depth profile)."""
    trees = real_trees(bundle, drafter, encoded, settings, progress)
    results = run_labs(trees, settings.draws, seed, progress)
    claim1, exit_law = check_exit_law(trees, results)
    claim2, coverage = check_coverage_bound(trees, results, settings.draws, seed)
    measurements = {"exit_law": exit_law, "coverage": coverage, "depth_profile": depth_profile(trees, results), "flows": [t["lab"].flow for t in trees]}
    return [claim1, claim2, check_equivalence(coverage)], measurements


def measure_latency(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> tuple[dict, dict]:
    """Claim 4: the verifier stage on real trees, plus the synthetic large-vocabulary decision stage."""
    stage_rows = bench_verifier_stage(bundle, drafter, encoded, settings, seed, progress)
    synthetic = None
    if settings.synthetic_repeats > 0:
        synthetic = bench_verifiers(
            budgets=settings.latency_budgets, vocabs=(settings.synthetic_vocab,), verifiers=("tev", "predraw"), repeats=settings.synthetic_repeats,
            temperature=settings.latency_temperature, device=str(next(bundle.target.parameters()).device), seed=seed, progress=progress,
        )
    return check_latency(stage_rows, synthetic), {"real_trees": stage_rows, "synthetic": synthetic}


def measure_decoding(bundle, base: str, prompts, settings: ReportSettings, seed: int, exittrain_results: dict | None, progress: bool) -> tuple[list[dict], dict]:
    """Claims 5-7: the budget sweep and the end-to-end comparison (each one interleaved run)."""
    drafters = [d for d in (base, "exittrain") if d in bundle.drafters]
    common = dict(temperatures=settings.temperatures, max_new_tokens=settings.max_new_tokens, repeats=settings.e2e_repeats, seed=seed, progress=progress)
    sweep = bench_e2e(bundle, prompts, budgets=settings.sweep_budgets, methods=tuple((d, "tev") for d in drafters), **common)
    e2e_methods = (("chain", "tev"), (base, "predraw"), (base, "tev"), ("exittrain", "tev"))
    e2e = bench_e2e(bundle, prompts, budgets=(settings.e2e_budget,), methods=e2e_methods, **common)
    if exittrain_results is not None:
        exittrain = exittrain_from_results(exittrain_results)
    else:
        exittrain = exittrain_from_sweep(sweep) if "exittrain" in bundle.drafters else None
    claims = [check_exittrain(exittrain), check_sweep(sweep, drafters), check_e2e(e2e, base)]
    return claims, {"exittrain": exittrain, "sweep": sweep, "e2e": e2e, "sweep_drafters": drafters}


def write_plots(measurements: dict, plots_dir: Path) -> dict:
    """Every plot as PNG and HTML; returns ``{name: {"png", "html"}}`` (paths relative to the report)."""
    profile = measurements["depth_profile"]
    return {
        "exit_depth": plot_exit_depths(profile, plots_dir),
        "mass_by_depth": plot_mass_by_depth(measurements["flows"], profile, plots_dir),
        "budget_sweep": plot_budget_sweep(measurements["sweep"], measurements["sweep_drafters"], plots_dir),
        "tau_by_method": plot_tau_by_method(measurements["e2e"], plots_dir),
        "stage_times": plot_stage_times(measurements["e2e"], plots_dir),
    }


def build_report(
    bundle,
    out_dir: Path,
    quick: bool,
    prompts: list[dict],
    seed: int,
    exittrain_results: dict | None,
    progress: bool = True,
    command: str | None = None,
    settings: ReportSettings | None = None,
) -> dict:
    """Measure every claim on ``bundle`` and write ``report.md``, ``report.json`` and plots
    (``plots/*.png`` and ``plots/*.html``) into ``out_dir``. Returns the report dict (as in
    report.json).

    ``prompts``: ``[{"id", "text"}]`` (or ``"ids"``); all of them are used (cut the list first).
    ``settings`` overrides the ``QUICK`` / ``FULL`` preset chosen by ``quick``.
    """
    settings = settings or (QUICK if quick else FULL)
    if not prompts:
        raise ValueError("the report needs at least one prompt")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = "block" if "block" in bundle.drafters else "ar"  # the drafter of the real trees
    drafter = bundle.drafter(base)
    limit = bundle.context_length - settings.max_new_tokens
    encoded = [(str(p.get("id", i)), fit_prompt(bundle.tokenizer, p, limit)) for i, p in enumerate(prompts)]

    tree_claims, measurements = measure_trees(bundle, drafter, encoded, settings, seed, progress)
    latency_claim, measurements["latency"] = measure_latency(bundle, drafter, encoded, settings, seed, progress)
    decoding_claims, decoding = measure_decoding(bundle, base, prompts, settings, seed, exittrain_results, progress)
    measurements.update(decoding)
    plots = write_plots(measurements, out_dir / "plots")
    for key in ("flows", "sweep_drafters"):
        measurements.pop(key)
    report = {
        "title": "TEV Explorer: the paper's claims on this model pair",
        "command": command or "build_report(...) (library call)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seed": seed,
        "quick": quick,
        "machine": machine_info(next(bundle.target.parameters()).device),
        "target": _shown_source(bundle.target_source),
        "drafters": list(bundle.drafters),
        "tree_drafter": base,
        "settings": asdict(settings),
        "prompts": [{"id": pid, "tokens": len(ids)} for pid, ids in encoded],
        "claims": tree_claims + [latency_claim] + decoding_claims,
        "measurements": measurements,
        "plots": plots,
    }
    (out_dir / "report.md").write_text(render_markdown(report))
    report = _clean(report)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, allow_nan=False))
    return report


# --------------------------------------------------------------------------- command line
def _load_prompts(args) -> list[dict]:
    """Prompts from ``--prompts-file`` (a JSON list, or a dict with ``"prompts"``) or the named set."""
    from tev.data.prompts import load_prompt_set

    if args.prompts_file:
        data = json.loads(Path(args.prompts_file).read_text())
        prompts = data["prompts"] if isinstance(data, dict) else data
        if not isinstance(prompts, list) or not all(isinstance(p, dict) and ("text" in p or "ids" in p) for p in prompts):
            raise ValueError(f"{args.prompts_file}: expected a list of {{'id', 'text'}} objects (or a dict with 'prompts')")
    else:
        prompts = load_prompt_set(args.prompts)
    return prompts


def _command_line(args) -> str:
    """The command that reproduces this run, rebuilt from the parsed options."""
    parts = ["python", "-m", "tev", "bench", "report"]
    for flag, value in (("--target", args.target), ("--draft", args.draft), ("--device", args.device), ("--dtype", args.dtype), ("--device-map", args.device_map)):
        if value is not None and value != "auto":
            parts += [flag, str(value)]
    parts += ["--quick"] if args.quick else []
    parts += ["--prompts-file", args.prompts_file] if args.prompts_file else ["--prompts", args.prompts]
    parts += ["--num-prompts", str(args.num_prompts)] if args.num_prompts is not None else []
    parts += ["--seed", str(args.seed)]
    parts += ["--exittrain-results", args.exittrain_results] if args.exittrain_results else []
    parts += ["--out", str(args.out)]
    return shlex.join(parts)


def report_command(args) -> None:
    from tev.engine.models import load_bundle
    from tev.util.paths import REPO_ROOT

    settings = QUICK if args.quick else FULL
    if args.num_prompts is not None:
        if args.num_prompts < 1:
            raise ValueError("--num-prompts must be at least 1")
        settings = replace(settings, num_prompts=args.num_prompts)
    args.out = Path(args.out) if args.out else REPO_ROOT / "runs" / f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    exittrain_results = json.loads(Path(args.exittrain_results).read_text()) if args.exittrain_results else None
    if exittrain_results is not None and not isinstance(exittrain_results.get("rows") if isinstance(exittrain_results, dict) else None, list):
        raise ValueError(f"{args.exittrain_results}: expected a JSON object with a 'rows' list (from `python -m tev bench exittrain`)")
    prompts = _load_prompts(args)[: settings.num_prompts]
    bundle = load_bundle(args.target, args.draft, device=args.device, dtype=args.dtype, device_map=args.device_map, allow_download=args.allow_download)
    report = build_report(bundle, args.out, args.quick, prompts, args.seed, exittrain_results, progress=True, command=_command_line(args), settings=settings)
    print(claims_table(report["claims"]))
    print(f"\nreport written to {args.out / 'report.md'} (and report.json, plots/)")
