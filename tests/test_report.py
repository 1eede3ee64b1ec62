"""``python -m tev bench report`` on tiny models: the report is produced and well-formed."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from tev.bench.e2e import format_e2e_table
from tev.cli import main
from tev.engine.models import load_bundle
from tev.bench.report import QUICK, build_report
from tev.bench.report.coverage import check_coverage_bound
from tev.bench.report.e2e_speed import best_budget_rows, check_e2e, e2e_section
from tev.bench.report.exit_law import check_exit_law, chi_square_cells
from tev.bench.report.exittrain_gain import check_exittrain, exittrain_from_results, exittrain_section
from tev.bench.report.plots import plot_exittrain_mass
from tev.bench.report.trees import real_trees, run_labs
from tev.core import verify
from tev.engine.round import STAGES
from tests.tiny import save_pair

# The tiny target's context is 96 tokens: short snippets only.
PROMPTS = [
    {"id": "add", "text": "def add(a, b):\n    return a + b\n"},
    {"id": "loop", "text": "for i in range(10):\n    print(i)\n"},
    {"id": "class", "text": "class A:\n    pass\n\ndef add(a,"},
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOLDS = {"yes", "partly", "no", "n/a"}

# Fake ExitTrain ablation rows (as `python -m tev bench exittrain` writes them): exit beats
# none beats base, prefix below exit; the mean exit/base gain is (2.2/2.0 + 3.3/3.0) / 2 - 1 = 0.10.
EXITTRAIN = {
    "rows": [
        {"drafter": "base", "budget": 32, "temperature": 0.0, "tau": 2.0, "tau_bound": 2.0},
        {"drafter": "none", "budget": 32, "temperature": 0.0, "tau": 2.1, "tau_bound": 2.1},
        {"drafter": "prefix", "budget": 32, "temperature": 0.0, "tau": 2.05, "tau_bound": 2.05},
        {"drafter": "exit", "budget": 32, "temperature": 0.0, "tau": 2.2, "tau_bound": 2.2},
        {"drafter": "base", "budget": 32, "temperature": 1.0, "tau": 3.0, "tau_bound": 3.1},
        {"drafter": "none", "budget": 32, "temperature": 1.0, "tau": 3.1, "tau_bound": 3.2},
        {"drafter": "prefix", "budget": 32, "temperature": 1.0, "tau": 3.2, "tau_bound": 3.3},
        {"drafter": "exit", "budget": 32, "temperature": 1.0, "tau": 3.3, "tau_bound": 3.4},
    ]
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("report-pair"))


def claims_rows(markdown: str) -> list[list[str]]:
    """The cells of the claims table: the first table after '## Claims'."""
    table = markdown.split("## Claims", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    assert table[0].startswith("| # | claim |") and all(line.startswith("|") for line in table)
    rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]] for line in table[2:]]
    assert all(len(row) == 5 for row in rows), rows
    return rows


CLAIM_IDS = [1, 2, 3, 4, 5, "5b", 6, 7]


def _workload_result(base: float, adapted: float, control: float) -> dict:
    cell = lambda tau: {"tau": tau, "se": 0.02, "mean_block_length": tau + 0.1, "prompts": 10}  # noqa: E731
    gain = lambda tau: {"gain": tau / base - 1, "se": 0.02}  # noqa: E731
    by_t = {"base": cell(base), "adapted": cell(adapted), "token_only": cell(control)}
    return {"T0": by_t, "T0.7": by_t, "T1": by_t, "gain": {t: {"adapted": gain(adapted), "token_only": gain(control)} for t in ("T0", "T0.7", "T1")},
            "minutes": 4.5, "settings": {"tree_term": "exit"}}


def _written_before(result: dict) -> dict:
    """A result measured before tau counted tokens per forward (as migrated): its cells hold only the mean block length, and name it."""
    old = lambda cells: {name: {"mean_block_length": c["tau"], "mean_block_length_se": c["se"], "figure": "mean_block_length"} for name, c in cells.items()}  # noqa: E731
    return {**result, **{t: old(result[t]) for t in ("T0", "T0.7", "T1")}}


WORKLOAD = {"sql": _workload_result(1.5, 2.5, 2.45), "json": _written_before(_workload_result(1.6, 3.0, 3.0))}


def check_report(out, expect_exittrain: bool, expect_workload: bool = False) -> dict:
    markdown = (out / "report.md").read_text()
    rows = claims_rows(markdown)
    assert [row[0] for row in rows] == [str(i) for i in CLAIM_IDS], rows
    holds = [row[-1].strip("*") for row in rows]
    assert all(h in HOLDS for h in holds), holds

    report = json.loads((out / "report.json").read_text())
    claims = report["claims"]
    assert [c["id"] for c in claims] == CLAIM_IDS
    assert [c["holds"] for c in claims] == holds  # markdown and JSON agree
    assert report["precision"]["target_dtype"] == "float32" and f"CPU capability {report['precision']['cpu_capability']}" in markdown
    for claim in claims:
        assert claim["rule"] and claim["paper"] and claim["this_run"]
        if claim["holds"] != "n/a":
            assert isinstance(claim["value"], (int, float)) and math.isfinite(claim["value"]), claim
            assert all(isinstance(v, (int, float)) for v in claim["figures"].values()), claim
    # Exact math on real trees: these hold on any correct implementation, tiny models included.
    assert [c["holds"] for c in claims[:3]] == ["yes", "yes", "yes"], [c["this_run"] for c in claims[:3]]
    exit_law = claims[0]["figures"]
    assert exit_law["max_limit_ratio"] < 1 and exit_law["draws"] > 0  # every error within its float32 limit
    assert claims[1]["figures"]["chain_mean_length"] < claims[1]["figures"]["tau_bound"]
    if expect_exittrain:
        assert claims[4]["holds"] == "yes" and claims[4]["value"] == pytest.approx(0.10)
    else:
        assert claims[4]["holds"] == "n/a" and "not run (pass --exittrain-results)" in claims[4]["this_run"]
    if expect_workload:  # claim 5b: +66.7% and +87.5% at T = 0, both beyond one standard error
        assert claims[5]["holds"] == "yes" and claims[5]["value"] == pytest.approx((2.5 / 1.5 + 3.0 / 1.6) / 2 - 1)
        assert "| sql | 1.500 +- 0.020 |" in markdown and "| json *(mean block length)* | 1.600 +- 0.020 |" in markdown  # an older file still reads
        assert "T = 0.7 top-p 0.9 (the page's law): +77.1% (control +75.4%), at least +15% on 2 of 2 packs" in claims[5]["this_run"]
        assert "**T = 0.7, top-p 0.9 (TEV; the page's law)**" in markdown
    else:
        assert claims[5]["holds"] == "n/a" and "not run (pass --workload-results)" in claims[5]["this_run"]
    assert set(report["measurements"]) >= {"exit_law", "coverage", "latency", "sweep", "e2e"}
    assert {r["budget"] for r in report["measurements"]["sweep"]["rows"]} == set(QUICK.sweep_budgets)
    assert report["measurements"]["latency"]["synthetic"] is None  # skipped in --quick

    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", markdown)
    assert len(images) == 5
    for image in images:
        assert (out / image).read_bytes()[:8] == PNG_MAGIC, image
    # every plot the report lists is a PNG embedded in report.md, and nothing else is written
    assert sorted(report["plots"].values()) == sorted(images)
    assert sorted(path.name for path in (out / "plots").iterdir()) == sorted(image.split("/")[-1] for image in images)
    return report


def test_build_report_quick(pair, tmp_path):
    bundle = load_bundle(pair["target"], pair["block"], device="cpu")
    out = tmp_path / "report"
    report = build_report(bundle, out, quick=True, prompts=PROMPTS[:2], seed=0, exittrain_results=EXITTRAIN, progress=False, workload_results=WORKLOAD)
    check_report(out, expect_exittrain=True, expect_workload=True)
    assert report["prompts"][0]["id"] == "add" and report["quick"] is True


def test_report_command(pair, tmp_path, capsys):
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(PROMPTS[:2]))
    out = tmp_path / "cli-report"
    code = main(["bench", "report", "--quick", "--target", str(pair["target"]), "--draft", str(pair["block"]), "--device", "cpu",
                 "--prompts-file", str(prompts_file), "--seed", "1", "--out", str(out)])
    assert code == 0
    report = check_report(out, expect_exittrain=False)
    assert "--quick" in report["command"] and "--seed 1" in report["command"]
    printed = capsys.readouterr().out
    assert "| # | claim |" in printed and len(re.findall(r"^\| [1-7]b? \|", printed, flags=re.M)) == 8  # the claims table, printed


def test_the_exit_law_and_coverage_checks_catch_a_biased_verifier(pair, monkeypatch):
    """A 'TEV' that exits at a uniformly random node is exact in form but wrong in law:
    claims 1 and 2 must say no."""
    bundle = load_bundle(pair["target"], pair["block"], device="cpu")
    encoded = [(p["id"], bundle.tokenizer(p["text"])["input_ids"]) for p in PROMPTS]
    trees = real_trees(bundle, bundle.drafter("block"), encoded, QUICK, progress=False)

    def uniform_exit(tree, rows, generator, log):
        exit_node = int(torch.randint(tree.num_nodes, (1,), generator=generator))
        return verify.Verdict(tree.path_to(exit_node), exit_node, 0, "tev")

    monkeypatch.setitem(verify._IMPLEMENTATIONS, "tev", uniform_exit)
    results = run_labs(trees, QUICK.draws, seed=0, progress=False)
    exit_law, _ = check_exit_law(trees, results)
    coverage, _ = check_coverage_bound(trees, results, QUICK.draws, seed=0)
    assert exit_law["holds"] == "no" and exit_law["figures"]["chi2_p_value"] < 1e-6
    assert exit_law["figures"]["max_limit_ratio"] < 1  # the flow itself is still right
    assert coverage["holds"] == "no"


def test_a_small_exittrain_gain_holds_only_partly():
    """Right order but a gain far below the paper's +13%: the row says partly, not yes."""
    base = [row for row in EXITTRAIN["rows"] if row["drafter"] == "base"]
    small = {"rows": [{**row, "drafter": name, "tau": row["tau"] * factor} for row in base for name, factor in (("base", 1.0), ("none", 1.01), ("prefix", 0.999), ("exit", 1.02))]}
    claim = check_exittrain(exittrain_from_results(small))
    assert claim["holds"] == "partly" and claim["value"] == pytest.approx(0.02)
    assert "exit beats none in 2 and prefix in 2 of 2 settings" in claim["this_run"]
    backwards = {"rows": [{**row, "tau": 1.0 if row["drafter"] == "exit" else row["tau"]} for row in EXITTRAIN["rows"]]}
    assert check_exittrain(exittrain_from_results(backwards))["holds"] == "no"


def test_chi_square_pools_small_cells_and_flags_draws_outside_the_law():
    # two cells of expected 50 each: (30 - 50)^2 / 50 + (70 - 50)^2 / 50 = 16 on 1 dof
    statistic, dof = chi_square_cells([30, 70], [0.5, 0.5])
    assert statistic == pytest.approx(16.0) and dof == 1
    # the third cell expects 1 draw (< 5), so it is its own pooled cell: 8 + 19^2 / 49 + 1 on 2 dof
    statistic, dof = chi_square_cells([30, 68, 2], [0.5, 0.49, 0.01])
    assert statistic == pytest.approx(8 + 361 / 49 + 1) and dof == 2
    # a draw where w puts no mass at all cannot come from the law
    assert chi_square_cells([50, 49, 1], [0.5, 0.5, 0.0])[0] == math.inf


def test_claim_5_reads_the_pooled_rows_and_shows_domains_errors_and_the_exit_mass(tmp_path):
    """Per-domain rows never overwrite the pooled ones; the section shows standard errors, the
    gain by domain and the held-out exit mass, with its plot."""
    rows = []
    for drafter, factor in (("base", 1.0), ("none", 1.01), ("prefix", 1.0), ("exit", 1.05)):
        rows.append({"drafter": drafter, "budget": 32, "temperature": 0.0, "tau": 2.0 * factor, "tau_se": 0.05})
        rows.append({"drafter": drafter, "budget": 32, "temperature": 0.0, "tau": 9.0, "tau_se": 0.5, "domain": "code"})  # must not be read as pooled
    rows.append({"drafter": "exit", "budget": 32, "temperature": 0.0, "tau": 9.9, "tau_se": 0.5, "domain": "math"})
    rows.append({"drafter": "base", "budget": 32, "temperature": 0.0, "tau": 9.0, "tau_se": 0.5, "domain": "math"})
    trees = {name: {"tau_bound": 1.8, "internal": [0.3, 0.2, 0.1], "leaf": [0.0, 0.3, 0.1]} for name in ("base", "exit")}
    data = exittrain_from_results({"rows": rows, "heldout_trees": trees, "command": "python -m tev bench exittrain"})
    assert data["settings"][0]["base"] == 2.0 and data["mean_gain"] == pytest.approx(0.05)
    assert data["domain_gains"] == pytest.approx({"code": 0.0, "math": 0.1})
    plots = {"exittrain_mass": plot_exittrain_mass(data["heldout_trees"], tmp_path / "plots")}
    lines = "\n".join(exittrain_section({"measurements": {"exittrain": data}, "plots": plots}))
    assert "2.100 +- 0.050" in lines and "math +10.0%" in lines and "| exit | 1.800 | 0.300 + 0.000" in lines
    assert "plots/exittrain_mass.png" in lines and (tmp_path / "plots" / "exittrain_mass.png").is_file()
    assert "| B | T | tau base |" in lines
    # rows measured before tau counted tokens per forward hold only the mean block length: named so
    old = [{**{("mean_block_length" + key[3:] if key.startswith("tau") else key): value for key, value in row.items()}, "figure": "mean_block_length"} for row in rows]
    old_lines = "\n".join(exittrain_section({"measurements": {"exittrain": exittrain_from_results({"rows": old})}, "plots": {}}))
    assert "| B | T | mean block length base |" in old_lines and "2.100 +- 0.050" in old_lines and "Mean mean block length gain" not in old_lines


def _e2e_row(temperature, budget, method, speedup, tokens_per_second, vs_hf=float("nan")):
    return {"temperature": temperature, "budget": budget, "method": method, "tau": 2.0, "mean_block_length": 2.1, "tau_bound": 2.1, "tokens_per_second": tokens_per_second,
            "tokens_per_second_q25": tokens_per_second, "tokens_per_second_q75": tokens_per_second, "speedup": speedup, "speedup_q25": speedup,
            "speedup_q75": speedup, "speedup_vs_hf": vs_hf, "speedup_vs_lookup": vs_hf, "ms_per_token": 1e3 / tokens_per_second,
            "weight_reads_per_token": 1e3 / tokens_per_second / 25.0, "stage_ms_per_round": dict.fromkeys(STAGES, 1.0), "by_domain": {}, "runs": 6}


def test_claim_7_from_a_bench_e2e_file_takes_the_best_budget_and_names_the_reference():
    """Given ``--e2e-results``, claim 7 reads the budget where TEV is fastest at T = 1, gives
    the speed-up over HF generate and the weight reads per token, and names the command."""
    rows = []
    for budget, tev, predraw in ((8, 0.9, 0.8), (16, 1.2, 1.3)):
        rows += [_e2e_row(1.0, budget, "autoregressive", 1.0, 10.0), _e2e_row(1.0, budget, "hf-generate", 1.0, 10.0, 1.0),
                 _e2e_row(1.0, budget, "block+tev", tev, 10.0 * tev, tev), _e2e_row(1.0, budget, "block+predraw", predraw, 10.0 * predraw)]
    e2e = {"prompts": 6, "repeats": 1, "max_new_tokens": 64, "rows": rows, "command": "python -m tev bench e2e --budgets 8 16",
           "weight_read": {"bytes": 540e6, "gb_per_s": 21.6, "ms": 25.0}}
    chosen = best_budget_rows(e2e, "block")
    assert {r["budget"] for r in chosen["rows"]} == {16} and chosen["weight_read"] == e2e["weight_read"]
    claim = check_e2e(chosen, "block")
    assert claim["value"] == pytest.approx(1.2) and claim["holds"] == "no"  # faster than AR, slower than predraw
    assert "T=1 block+tev: 12.0 tok/s, 1.20x (1.20x HF generate), 3.3 weight reads/token" in claim["this_run"]
    assert "T=1 block+predraw: 13.0 tok/s, 1.30x, 3.1 weight reads/token" in claim["this_run"]  # no peer: no NaN shown
    lines = "\n".join(e2e_section({"measurements": {"e2e": chosen}, "plots": {"tau_by_method": "plots/a.png", "stage_times": "plots/b.png"}}))
    assert "`python -m tev bench e2e --budgets 8 16`" in lines and "540 MB" in lines and "25.0 ms" in lines
    faster = {**chosen, "rows": [{**r, "tokens_per_second": 99.0} if r["method"] == "block+tev" else r for r in chosen["rows"]]}
    assert check_e2e(faster, "block")["holds"] == "yes"


def test_report_command_refuses_an_e2e_file_of_another_shape(tmp_path, capsys):
    wrong = tmp_path / "not-e2e.json"
    wrong.write_text(json.dumps({"rows": []}))
    assert main(["bench", "report", "--quick", "--e2e-results", str(wrong), "--out", str(tmp_path / "r")]) != 0
    assert "expected a stored e2e result" in capsys.readouterr().err  # a file without the e2e schema
    assert not (tmp_path / "r").exists()  # refused before any model loads or anything is written


def test_a_shipped_e2e_result_with_the_earlier_stage_names_still_reads():
    # docs/e2e/*.json were written when the stages were draft, tree_build, verify, verify_decision, commit
    result = json.loads((Path(__file__).resolve().parent.parent / "docs" / "e2e" / "fp32.json").read_text())
    table = format_e2e_table(result)
    assert "draft / tree_build / verify / verify_decision / commit ms per round" in table
    assert len(table.splitlines()) == 2 + len(result["rows"])
