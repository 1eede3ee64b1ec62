"""The GPU check (``tev/drive/gpu_check.py``) on a CPU: its steps in ``--quick`` size, its runner, and its plan.

A GPU machine is lent rarely and briefly, so the check's own code must already work when it
gets there: every in-process step runs here on the CPU, the runner is driven with stand-in
commands (pass, fail, timeout, skips, the time allowed spent), and the steps are shown to fail on
a biased verifier and on a wrong greedy token.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tev.core.verify import Verdict
from tev.drive import gpu_check

REPO = Path(__file__).resolve().parent.parent

NEEDS_WHAT_THE_GPU_MACHINE_LACKS = ("gradio", "gradio_client", "plotly", "hypothesis", "playwright", "visual", "app", "ui", "gguf")
FIXTURES_IT_CANNOT_BUILD = ("quick_assets_dir", "app_server")  # build-assets --quick reads the HumanEval package


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    return gpu_check.Options(device="cpu", quick=True, work=tmp_path_factory.mktemp("gpu-check-work"))


# ------------------------------------------------------------------ the steps, on the CPU
def test_environment_reports_versions_and_knows_the_cache_argument(options):
    result = gpu_check.step_environment(options)
    assert result["ok"], result["problems"]
    assert result["info"]["llama_forward_knows_cache"] and result["info"]["versions"]["torch"] == torch.__version__


def test_greedy_step_compares_speculation_with_greedy_decoding(options):
    result = gpu_check.step_greedy(options)
    assert result["ok"], result["problems"]
    assert [row["dtype"] for row in result["rows"]] == ["float32", "bfloat16"]
    assert all(row["runs"] >= 1 for row in result["rows"]) and result["rows"][0]["equal_token_for_token"] == result["rows"][0]["runs"]


def test_greedy_step_fails_on_a_wrong_token(options, monkeypatch):
    real = gpu_check.run_to_end

    def one_token_off(events):
        records, summary = real(events)
        summary.token_ids[2] = (summary.token_ids[2] + 1) % 8192  # what a broken tree forward would emit
        return records, summary

    monkeypatch.setattr(gpu_check, "run_to_end", one_token_off)
    result = gpu_check.step_greedy(options)
    assert not result["ok"]
    assert any("float32" in p and "parts from greedy decoding at token 2" in p for p in result["problems"])
    assert any("bfloat16" in p and "rounding ties below the argmax" in p for p in result["problems"])


def test_chi_square_step_accepts_the_verifiers(options):
    result = gpu_check.step_chi_square(options)
    assert result["ok"], result["problems"]
    assert [r["verifier"] for r in result["results"]] == list(gpu_check.SAMPLING_VERIFIERS)
    assert all(0 < r["p_value"] <= 1 and r["draws"] == 500 for r in result["results"])


def test_chi_square_step_fails_on_a_biased_verifier(options, monkeypatch):
    real = gpu_check.verify_rows

    def biased(name, tree, rows, generator):
        verdict = real(name, tree, rows, generator)  # the right exit node, then the next token id as bonus
        return Verdict(verdict.path, verdict.exit_node, (verdict.bonus_token + 1) % rows.vocab_size, name)

    monkeypatch.setattr(gpu_check, "verify_rows", biased)
    result = gpu_check.step_chi_square(options)
    assert not result["ok"]
    assert {p.split(":")[0] for p in result["problems"]} == set(gpu_check.SAMPLING_VERIFIERS)


def test_host_syncs_step_says_it_needs_cuda(options):
    result = gpu_check.step_host_syncs(options)
    assert result["ok"] and result["skipped"]


def test_bench_steps_run_the_command_line(options):
    verifiers = gpu_check.step_bench_verifiers(options)
    assert verifiers["ok"], verifiers["problems"]
    assert verifiers["result"]["rows"][0]["budget"] == 8 and len(verifiers["markdown"]) == 3
    e2e = gpu_check.step_bench_e2e(options)
    assert e2e["ok"], e2e["problems"]
    methods = {row["method"] for row in e2e["result"]["rows"]}
    assert {"autoregressive", "block+greedy", "block+tev"} <= methods
    assert e2e["result"]["precision"]["cpu_capability"] and e2e["result"]["precision"]["drafter_dtypes"]


def test_smollm2_shape_step_times_one_token_and_tree_forwards(options):
    result = gpu_check.step_smollm2_shape(options)
    assert result["ok"], result["problems"]
    (row,) = result["rows"]
    assert all(row[key] > 0 for key in ("one_token_ms", "tree32_ms", "tree64_ms", "tev64_ms", "predraw64_ms", "greedy64_ms"))
    assert row["tree64_root_vs_one_token_max_abs"] < 1e-3  # float32 on the CPU: the root row is the one-token forward
    full = gpu_check.smollm2_shape_config(quick=False)
    shape = (full.hidden_size, full.num_hidden_layers, full.num_attention_heads, full.num_key_value_heads, full.intermediate_size, full.vocab_size)
    assert shape == (576, 30, 9, 3, 1536, 49152) and full.tie_word_embeddings and full.rope_parameters["rope_theta"] == 100000.0


def test_the_child_side_writes_its_result(options, tmp_path):
    result = tmp_path / "environment.json"
    code = gpu_check.main(["--run-step", "environment", "--device", "cpu", "--work", str(options.work), "--result", str(result)])
    assert code == 0 and json.loads(result.read_text())["ok"]


# ------------------------------------------------------------------ the runner
def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_the_runner_records_passes_failures_timeouts_skips_and_the_time_allowed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = tmp_path / "step.json"
    steps = [
        gpu_check.Step("passes", "exit 0", 10, python("pass")),
        gpu_check.Step("fails", "exit 3", 10, python("import sys; sys.exit(3)")),
        gpu_check.Step("reports", "writes a failing result", 10, python(f"import json; open({str(result)!r}, 'w').write(json.dumps({{'ok': False, 'problems': ['bad'], 'summary': 's'}}))"), result=result),
        gpu_check.Step("skips", "pytest with skipped tests", 10, python("print('1 passed, 2 skipped in 0.01s')"), log=out / "pytest.log", no_skips=True),
        gpu_check.Step("hangs", "sleeps past its timeout", 3, python("import time; time.sleep(30)")),
        gpu_check.Step("late", "never runs", 10, python("pass")),
    ]
    meta = {"started": "now", "device": "cpu", "quick": True, "seconds_allowed": 28}
    records = gpu_check.run_all(steps, out, seconds=28, meta=meta)  # 23 s to spend; after "hangs" less than the 20 s a step needs
    by_name = {r["name"]: r for r in records}
    assert by_name["passes"]["ok"] and by_name["passes"]["returncode"] == 0
    assert not by_name["fails"]["ok"] and by_name["fails"]["returncode"] == 3
    assert not by_name["hangs"]["ok"] and "timed out" in by_name["hangs"]["error"] and by_name["hangs"]["seconds"] < 10 and by_name["hangs"]["timeout"] == 3
    assert not by_name["reports"]["ok"] and by_name["reports"]["error"] == "bad"
    assert not by_name["skips"]["ok"] and by_name["skips"]["details"]["counts"] == {"passed": 1, "skipped": 2}
    assert not by_name["late"]["ok"] and by_name["late"]["skipped"]
    saved = json.loads((out / "gpu-check.json").read_text())
    assert not saved["ok"] and [s["name"] for s in saved["steps"]] == [s.name for s in steps]
    summary = (out / "gpu-check.md").read_text()
    assert "| passes | pass |" in summary and "| fails | FAIL |" in summary and "| late | skipped |" in summary and "- **hangs**: timed out" in summary


# ------------------------------------------------------------------ the plan and the shell script
def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_plan_runs_the_brief_order_and_only_tests_that_can_run_there(options, tmp_path):
    steps = gpu_check.plan(gpu_check.Options(device="cuda", work=tmp_path), tmp_path)
    assert [s.name for s in steps] == [
        "environment", "pytest-cuda", "greedy", "chi-square", "host-syncs", "bench-verifiers", "bench-e2e", "smollm2-shape", "pytest-other",
    ]
    assert steps[1].no_skips and "tests/test_cuda.py" in steps[1].command
    assert sum(s.timeout for s in steps[:-1]) < 1200 and all(s.timeout <= 200 for s in steps)
    deselected = re.findall(r"not (\w+)", gpu_check.OTHER_TESTS_DESELECT)
    for name in gpu_check.OTHER_TESTS:
        path = REPO / name
        assert path.is_file(), name
        assert not _imports(path) & set(NEEDS_WHAT_THE_GPU_MACHINE_LACKS), f"{name} imports {_imports(path) & set(NEEDS_WHAT_THE_GPU_MACHINE_LACKS)}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and {a.arg for a in node.args.args} & set(FIXTURES_IT_CANNOT_BUILD):
                assert any(term in node.name for term in deselected), f"{name}::{node.name} needs a fixture the GPU machine cannot build"
    assert gpu_check.plan(options, tmp_path, only=("greedy",))[0].command[-1] == "--quick"


def test_the_shell_script_is_valid_bash_that_installs_nothing_from_a_network():
    script = REPO / "scripts" / "gpu-check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "set -uo pipefail" in text and "timeout 480" in text and "--no-index" in text
    installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and all("--no-index" in line for line in installs)
