"""Stored results: one schema per kind, one reader that refuses older files, the migration that
rewrites them once, and every JSON file under assets/ and docs/ read by its reader."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tev.cli import main
from tev.data.prompts import load_prompt_set
from tev.engine.block_drafter import read_drafter_config
from tev.pipelines.card import refresh_card
from tev.pipelines.migrate import migrate_data, upgrade_data
from tev.pipelines.workload_data import load_workload
from tev.util.paths import REPO_ROOT
from tev.util.stored import StoredResultError, read_result, row_figure, rows_figure, write_result

# every JSON file under assets/ and docs/, by path: a stored result's kind, or the reader of a file that is no result
RESULTS = [
    ("assets/models/build.json", "build"), ("*/training.json", "training"), ("docs/drafter-reach/*-training.json", "training"),
    ("*/exittrain.json", "exittrain"), ("assets/models/*/workload-results.json", "workload-table"), ("docs/exittrain-ablation.json", "ablation"),
    ("docs/workload*/*-prompts.json", None), ("docs/workload*.json", "workload"), ("docs/*/e2e-*.json", "e2e"), ("docs/e2e/page-speed-*.json", "page-speed"),
    ("docs/row-cost/page-speed-*.json", "page-speed"), ("docs/e2e/*.json", "e2e"), ("docs/loadtest/*.json", "loadtest"), ("docs/report/report.json", "report"),
    ("docs/row-cost/row-cost-*.json", "row-cost"), ("docs/drafter-reach/reach-*.json", "reach"), ("docs/drafter-reach/oracle-reach*.json", "oracle-reach"),
    ("docs/adapted-coverage/*.json", "adapted-coverage"),
    ("docs/page-load/*.json", "page-load"),
    ("docs/bf16-divergence.json", "measurement"), ("docs/sampling-defaults.json", "measurement"), ("docs/exittrain-diagnosis.json", "measurement"),
]
OLD_KEYS = ("expected_tau", "lambda_exit", "drafter_steps", "drafter_batch", "drafter_window", "loss_exit", "token_labels", "weights",
            "minutes_budget", "budget_seconds")


def _json_files() -> list[Path]:
    return sorted(p for folder in ("assets", "docs") for p in (REPO_ROOT / folder).rglob("*.json"))


def _kind(relative: str) -> str | None:
    return next((kind for pattern, kind in RESULTS if fnmatch(relative, pattern)), None)


def _read(path: Path):
    """``path`` read by its own reader: a stored result's, or the one of the input it is."""
    relative = str(path.relative_to(REPO_ROOT))
    kind = _kind(relative)
    if kind is not None:
        return read_result(path, kind)
    if path.name == "drafter_config.json":
        return read_drafter_config(path.parent)
    if relative.startswith("assets/prompts/"):
        return load_prompt_set(path.stem, path.parent)
    if relative.startswith("assets/workloads/") or fnmatch(relative, "docs/workload*/*-prompts.json"):
        return load_workload(path)
    assert relative.startswith("assets/models/target/"), f"{relative}: no reader known for it"
    return json.loads(path.read_text())  # the tiny target's own config and tokenizer: transformers reads them


def _keys(value):
    if isinstance(value, dict):
        yield from ((key, value) for key in value)
        for item in value.values():
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


@pytest.mark.parametrize("path", _json_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_json_file_reads_with_its_reader_and_holds_no_old_key(path):
    _read(path)
    data = json.loads(path.read_text())
    for key, holder in _keys(data):
        assert key not in OLD_KEYS and "expected_tau" not in key, f"{path}: old key {key!r}"
        # a row written since tau counts tokens per forward has both; its prompt_tau_q25/q75 are then tau's quartiles
        # (in an older row they were the mean block length's: the migration renames those)
        if (key == "tau" and not isinstance(holder["tau"], (dict, list))) or key.startswith("prompt_tau_q"):
            assert "mean_block_length" in holder, f"{path}: a row with {key} but no mean_block_length"
        if key == "exittrain" and isinstance(holder[key], dict) and "tau" in holder[key]:
            pytest.fail(f"{path}: a workload cell under the kept drafter's old name")
        if key == "command":
            assert "tev exittrain --workload" not in str(holder[key]), f"{path}: a workload command under the old subcommand"
        if key == "mean_block_length":
            row_figure(holder)  # a row without tau names its figure: row_figure refuses one that does not
    if _kind(str(path.relative_to(REPO_ROOT))) == "training":
        assert "resumed" in data, f"{path}: a training report that does not say what its run read from the work folder"


def test_the_card_renders_from_the_stored_results_as_committed(tmp_path):
    """The model card re-rendered from the shipped results is the committed one, word for word."""
    import shutil

    shutil.copytree(REPO_ROOT / "assets" / "models", tmp_path / "models", ignore=shutil.ignore_patterns("*.safetensors", "*.gguf"))
    refresh_card(tmp_path)
    assert (tmp_path / "README.md").read_text() == (REPO_ROOT / "assets" / "README.md").read_text()


def test_a_reader_refuses_an_unversioned_or_other_file_and_names_the_migrate_command(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"rows": [{"tau": 2.0, "tau_se": 0.1}]}))
    with pytest.raises(StoredResultError, match=r"carries no schema.*python -m tev migrate .*old\.json"):
        read_result(path, "e2e")
    write_result(path, "e2e", {"rows": []})
    assert read_result(path, "e2e") == {"schema": "e2e/2", "rows": []}
    assert next(iter(json.loads(path.read_text()))) == "schema"  # the first key
    with pytest.raises(StoredResultError, match="expected a stored workload result .* it is 'e2e/2'"):
        read_result(path, "workload")
    path.write_text(json.dumps({"schema": "e2e/0", "rows": []}))
    with pytest.raises(StoredResultError, match="it is 'e2e/0'.*python -m tev migrate"):
        read_result(path, "e2e")
    path.write_text("[1, 2]")
    with pytest.raises(StoredResultError, match="not a JSON object"):
        read_result(path, "e2e")


def test_the_migration_names_the_mean_block_length_and_the_old_keys():
    old_row = {"drafter": "base", "budget": 16, "temperature": 0.0, "tau": 2.254, "tau_se": 0.038, "tau_bound": 2.254,
               "prompt_tau_q25": 1.9, "prompt_tau_q75": 2.6, "rounds": 680}
    new_row = {"drafter": "base", "budget": 16, "temperature": 0.0, "mean_block_length": 2.254, "mean_block_length_se": 0.038, "tau_bound": 2.254,
               "prompt_mean_block_length_q25": 1.9, "prompt_mean_block_length_q75": 2.6, "rounds": 680, "figure": "mean_block_length"}
    current = {**{k: v for k, v in new_row.items() if k != "figure"}, "tau": 2.0, "tau_se": 0.05, "mean_block_length": 2.3}  # measured since: left as it is
    report = {"config": {"weights": "exit", "lambda_exit": 16.0, "token_labels": "soft", "soft_top": 16, "steps": 40},
              "heldout_expected_tau_before": 2.0, "heldout_trees": {"base": {"expected_tau": 2.0}},
              "history": [{"step": 1, "loss_exit": 0.05, "expected_tau": 1.9}], "tau": {"before": [old_row], "after": [current]},
              "ablation": "| T | B | drafter | tau (+- s.e.) | vs base |", "steps_done": 40, "seconds": 1.0}
    assert migrate_data(report, "exittrain") == {
        "schema": "exittrain/2", "settings": {"tree_term": "exit", "lambda_tree": 16.0, "soft_top": 16, "steps": 40},
        "heldout_tau_bound_before": 2.0, "heldout_trees": {"base": {"tau_bound": 2.0}},
        "history": [{"step": 1, "loss_tree": 0.05, "tau_bound": 1.9}], "tau": {"before": [new_row], "after": [current]},
        "ablation": "| T | B | drafter | mean block length (+- s.e. over rounds) | vs base |", "steps_done": 40, "seconds": 1.0}
    assert migrate_data({"config": {"weights": "none", "lambda_exit": 1.0}}, "exittrain")["settings"] == {"tree_term": "none", "lambda_tree": 1.0, "soft_top": 0}
    workload = {"T0": {"base": {"tau": 1.5, "se": 0.04}, "exittrain": {"tau": 2.5, "se": 0.05}}, "T1": {}, "gain": {"T0": {"exittrain": {"gain": 0.6, "se": 0.1}}},
                "tau_bound": {"T0": {"exittrain": 2.9}}, "heldout_mass": {"exittrain": {"expected_tau": 2.2}}}
    assert migrate_data(workload, "workload") == {
        "schema": "workload/3", "T0": {"base": {"mean_block_length": 1.5, "mean_block_length_se": 0.04, "figure": "mean_block_length"},
                                       "adapted": {"mean_block_length": 2.5, "mean_block_length_se": 0.05, "figure": "mean_block_length"}},
        "T1": {}, "gain": {"T0": {"adapted": {"gain": 0.6, "se": 0.1}}}, "tau_bound": {"T0": {"adapted": 2.9}}, "heldout_mass": {"adapted": {"tau_bound": 2.2}}}
    build = {"config": {"seed": 0, "drafter_horizon": 8, "drafter_window": 16, "drafter_steps": 3000, "drafter_batch": 256, "drafter_lr": 1e-3},
             "target": {}, "drafter": {"history": [{"step": 3000, "loss": 3.13}]}, "evaluation": {"tau": [old_row], "horizons": [{"horizon": 4, **old_row}]}}
    assert migrate_data(build, "build") == {
        "schema": "build/2", "config": {"seed": 0, "drafter": {"horizon": 8, "context_window": 16}, "drafter_training": {"steps": 3000, "batch": 256, "lr": 1e-3}},
        "target": {}, "drafter": {"history": [{"step": 3000, "running_loss": 3.13}]}, "evaluation": {"tau": [new_row], "horizons": [{"horizon": 4, **new_row}]}}
    training = {"recipe": {"seed": 0, "window": 16, "hidden": 256, "draft_vocab": 8192, "steps": 2400, "batch": 256, "eval_budget": 32}, "heldout": {}, "tau": [old_row]}
    assert migrate_data(training, "training") == {
        "schema": "training/2", "recipe": {"seed": 0, "eval_budget": 32, "drafter": {"context_window": 16, "hidden_size": 256, "draft_vocab_size": 8192},
                                           "train": {"steps": 2400, "batch": 256}}, "heldout": {}, "tau": [new_row], "resumed": None}


def test_the_command_migrates_a_file_once(tmp_path, capsys):
    path = tmp_path / "runs" / "e2e.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"rows": [{"method": "chain+greedy", "tau": 1.6, "tau_bound": 1.6}], "weight_read": {}, "truncation": None}, indent=2) + "\n")
    assert main(["migrate", "--dry-run", str(tmp_path)]) == 0 and "would migrate as e2e" in capsys.readouterr().out
    assert "schema" not in json.loads(path.read_text())
    assert main(["migrate", str(tmp_path)]) == 0 and "migrated as e2e" in capsys.readouterr().out
    assert read_result(path, "e2e")["rows"] == [{"method": "chain+greedy", "mean_block_length": 1.6, "tau_bound": 1.6, "figure": "mean_block_length"}]
    assert path.read_text().startswith('{\n  "schema": "e2e/2",')  # the file's own indent kept
    assert main(["migrate", str(path)]) == 0 and "already e2e/2" in capsys.readouterr().out



def test_a_result_of_an_older_version_is_brought_to_the_current_one(tmp_path, capsys):
    """A versioned file's older keys are renamed one version step at a time, and its reader refuses it until then."""
    old = {"schema": "workload/1", "T0": {}, "minutes": 4.2, "minutes_budget": 5.0, "workload": "w.json",
           "command": "python -m tev exittrain --workload w.json --json out.json --minutes 5"}
    assert upgrade_data(old) == {"schema": "workload/3", "T0": {}, "minutes": 4.2, "minutes_allowed": 5.0, "workload": "w.json",
                                 "command": "python -m tev adapt --workload w.json --json out.json --minutes 5"}
    assert list(upgrade_data(old)) == ["schema", "T0", "minutes", "minutes_allowed", "workload", "command"]  # the order kept
    table = {"schema": "workload-table/1", "packs": {"w": {"task": "t", "command": "python -m tev exittrain --workload w.json", "result": {"minutes": 4.2}}}}
    assert upgrade_data(table)["packs"]["w"]["command"] == "python -m tev adapt --workload w.json"
    assert upgrade_data({"schema": "gpu-check/1", "budget_seconds": 420})["seconds_allowed"] == 420
    assert upgrade_data({"schema": "workload-path/1", "minutes_budget": 5})["minutes_allowed"] == 5
    assert migrate_data({"T0": {}, "T1": {}, "gain": {}, "minutes_budget": 5}, "workload")["minutes_allowed"] == 5  # unversioned: to the current version
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old, indent=1))
    with pytest.raises(StoredResultError, match="it is 'workload/1'.*python -m tev migrate"):
        read_result(path, "workload")
    assert main(["migrate", str(path)]) == 0 and "migrated as workload/1 -> workload/3" in capsys.readouterr().out
    assert read_result(path, "workload")["minutes_allowed"] == 5.0
    assert main(["migrate", str(path)]) == 0 and "already workload/3" in capsys.readouterr().out
    path.write_text(json.dumps({"schema": "workload/9"}))
    assert main(["migrate", str(path)]) == 0 and "unknown schema 'workload/9'" in capsys.readouterr().out


def test_a_row_says_what_it_measured_and_readers_ask_it():
    tau_row = {"tau": 2.0, "tau_se": 0.05, "mean_block_length": 2.3}  # measured since tau counts tokens per forward: names no figure
    length_row = {"mean_block_length": 2.3, "mean_block_length_se": 0.04, "figure": "mean_block_length"}  # measured before, as migrated
    assert row_figure(tau_row) == "tau" and row_figure(length_row) == "mean_block_length"
    assert row_figure({**tau_row, "figure": "mean_block_length"}) == "mean_block_length"  # the statement decides, not the keys held
    assert rows_figure([tau_row, tau_row]) == "tau" and rows_figure([tau_row, length_row]) == "mean_block_length"  # a mixed table: the figure all hold
    with pytest.raises(StoredResultError, match="measured 'tau' but holds no such key.*python -m tev migrate"):
        row_figure({"mean_block_length": 2.3})  # an old row not migrated: refused, not read as whatever it holds


def test_the_migration_names_each_old_rows_figure_and_says_resumed_once():
    old_row = {"method": "chain+greedy", "mean_block_length": 1.6, "tau_bound": 1.6}
    peer_row = {"method": "hf-generate", "mean_block_length": None, "tau_bound": None}  # no tree: its (old) figure is null
    current = {"method": "chain+tev", "tau": 1.5, "mean_block_length": 1.7, "tau_bound": 1.8}
    e2e = upgrade_data({"schema": "e2e/1", "rows": [old_row, peer_row, current]})
    assert e2e == {"schema": "e2e/2", "rows": [{**old_row, "figure": "mean_block_length"}, {**peer_row, "figure": "mean_block_length"}, current]}
    assert upgrade_data(e2e) == e2e  # once: a current file is left as it is
    assert rows_figure(e2e["rows"]) == "mean_block_length" and rows_figure(e2e["rows"][2:]) == "tau"
    cell = {"mean_block_length": 1.5, "mean_block_length_se": 0.04}
    table = upgrade_data({"schema": "workload-table/2", "packs": {"sql": {"task": "t", "command": "c", "result": {"T0": {"base": cell}}}}})
    assert table["schema"] == "workload-table/3" and table["packs"]["sql"]["result"]["T0"]["base"]["figure"] == "mean_block_length"
    # a training report from before runs said what they read: "resumed" is null (not known), beside timings_s where the writer puts it
    training = upgrade_data({"schema": "training/1", "tau": [old_row], "timings_s": {"conversations_s": 5.0}, "total_minutes": 3.0})
    assert list(training) == ["schema", "tau", "timings_s", "resumed", "total_minutes"] and training["resumed"] is None
    said = {"shards_read": 3, "feature_parts_read": 0, "feature_parts": 9, "from_step": 0, "steps_s": 60.0}
    assert upgrade_data({"schema": "training/1", "tau": [], "timings_s": {}, "resumed": said})["resumed"] == said  # a run that said keeps it


def test_the_card_reads_what_the_run_said_it_resumed_and_never_guesses():
    from tev.pipelines.card import _read_whole, _resumed

    recipe = {"shards": 3, "train": {"steps": 2400}}
    # a stage of seconds once made the card guess the conversations were cached; a report that does not say gets no clause
    unknown = {"recipe": recipe, "timings_s": {"conversations_s": 5.0, "features_s": 1.0, "training_s": 900.0}, "resumed": None}
    assert _resumed(unknown) == "" and _read_whole(unknown) == set()
    said = {**unknown, "resumed": {"shards_read": 3, "feature_parts_read": 0, "feature_parts": 9, "from_step": 2400, "steps_s": 1800.0}}
    assert _resumed(said) == ("; it read 3 of its 3 shards from the work folder, written by earlier runs of the same command that were stopped; "
                              "its training had finished in an earlier run; all 2,400 steps took 30 min of their own")
    assert _read_whole(said) == {"conversations_s", "training_s"}
    with pytest.raises(KeyError):
        _resumed({key: value for key, value in unknown.items() if key != "resumed"})  # a report must say, even if only null
