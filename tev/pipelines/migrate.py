"""``python -m tev migrate PATH ...``: rewrite stored results written before they carried a schema
(:mod:`tev.util.stored`), or under an older version of their kind's, into today's names, once.
Values are only renamed and moved, never recomputed. This module alone knows the older names.

Unversioned files:

- a row or cell measured before ``tau`` counted tokens per target forward (it has ``tau`` and no
  ``mean_block_length``) held the mean block length under ``tau``, its error over rounds under
  ``tau_se`` (``se`` in a workload cell) and its per-prompt quartiles under ``prompt_tau_q25/q75``:
  they become ``mean_block_length``, ``mean_block_length_se``, ``prompt_mean_block_length_q25/q75``;
- ``expected_tau`` (mean ``1 + C``) is ``tau_bound`` in any key (``heldout_expected_tau_before`` ...);
- an ExitTrain ``config`` (``weights``, ``lambda_exit``, ``token_labels``) is ``settings``
  (``tree_term``, ``lambda_tree``, ``soft_top``: 0 unless the labels were soft), its history's
  ``loss_exit`` is ``loss_tree``, and its ablation table's ``tau`` column is named the mean block length;
- a workload result's kept drafter ``exittrain`` is ``adapted``; the workload table keeps its packs under ``packs``;
- the tiny build's flat ``drafter_<shape>`` and ``drafter_steps/batch/lr`` are ``drafter`` and
  ``drafter_training``, and its distillation history's ``loss`` (the running loss) is ``running_loss``;
- a training recipe's flat shape and training fields are ``recipe.drafter`` and ``recipe.train``.

Versioned files, one step a version (:data:`_UPGRADES`), after the steps above for an unversioned one:

- ``workload`` 1 -> 2: ``minutes_budget`` (the time limit, not a node budget) is ``minutes_allowed``,
  and a recorded ``python -m tev exittrain --workload ...`` is ``python -m tev adapt --workload ...``
  (workload adaptation's own command);
- ``workload-table`` 1 -> 2: each pack's recorded command likewise;
- ``workload-path`` 1 -> 2: ``minutes_budget`` is ``minutes_allowed``;
- ``gpu-check`` 1 -> 2: ``budget_seconds`` is ``seconds_allowed``;
- ``build``, ``training``, ``exittrain``, ``ablation``, ``e2e``, ``report``, ``measurement`` 1 -> 2 and
  ``workload``, ``workload-table`` 2 -> 3: a row or cell measured before ``tau`` counted tokens per
  forward (``mean_block_length`` and no ``tau``, at any depth) names its figure,
  ``"figure": "mean_block_length"``, so readers no longer tell it by the keys it lacks;
- ``training`` 1 -> 2 also: a report written before runs said what they read from their work folder
  gets ``"resumed": null`` (not known), where it once was guessed from how long a stage took.

Files that are no results (prompts, model and tokenizer configs, workload packs) are left alone,
except a drafter's ``drafter_config.json``, whose ``notes.exittrain`` settings get today's names.
"""

from __future__ import annotations

import json
from pathlib import Path

from tev.util.files import write_text_atomic
from tev.util.stored import BLOCK_LENGTH, FIGURE_KEY, SCHEMA_KEY, TAU, VERSIONS, stamped

__all__ = ["detect_kind", "migrate_data", "upgrade_data", "migrate_file", "migrate_command"]

_BLOCK_LENGTH = {"tau": "mean_block_length", "tau_se": "mean_block_length_se", "se": "mean_block_length_se",
                 "prompt_tau_q25": "prompt_mean_block_length_q25", "prompt_tau_q75": "prompt_mean_block_length_q75"}
_OLD_SHAPE = {"horizon": "horizon", "window": "context_window", "hidden": "hidden_size", "layers": "num_layers", "heads": "num_heads",
              "intermediate": "intermediate_size", "draft_vocab": "draft_vocab_size", "feature_dropout": "feature_dropout"}
_OLD_TRAIN = ("steps", "batch", "lr", "warmup", "weight_decay", "short_history_share", "save_every", "eval_every", "soft_top")
_OLD_ABLATION_HEADER, _ABLATION_HEADER = "| tau (+- s.e.) |", "| mean block length (+- s.e. over rounds) |"
_KEPT_BEFORE, _KEPT = "exittrain", "adapted"  # a workload result's kept drafter, named for the method before 2026-12-05
_WORKLOAD_LAWS = ("T0", "T0.7", "T1")
_EXITTRAIN_COMMAND, _ADAPT_COMMAND = "python -m tev exittrain ", "python -m tev adapt "  # workload adaptation's command before and since workload/2


# ------------------------------------------------------------------------------ renames
def _block_length_row(row: dict) -> dict:
    """A row or cell in today's names: one measured when ``tau`` was the mean block length
    (``tau`` and no ``mean_block_length``) has it renamed; any other row is unchanged."""
    if not isinstance(row, dict) or "tau" not in row or "mean_block_length" in row or isinstance(row["tau"], (dict, list)):
        return row
    return {_BLOCK_LENGTH.get(key, key): value for key, value in row.items()}


def _rows(rows):
    return [_block_length_row(row) for row in rows] if isinstance(rows, list) else rows


def _tau_bound_keys(value):
    """``value`` with ``expected_tau`` named ``tau_bound`` in every key, at any depth."""
    if isinstance(value, dict):
        return {key.replace("expected_tau", "tau_bound"): _tau_bound_keys(item) for key, item in value.items()}
    return [_tau_bound_keys(item) for item in value] if isinstance(value, list) else value


def _settings(config: dict) -> dict:
    """Old ExitTrain settings (``weights``, ``lambda_exit``, ``token_labels``) in today's names;
    the oldest trained on the written tokens and name no labels (``soft_top`` 0)."""
    if "weights" not in config and "lambda_exit" not in config:
        return config
    soft = config.get("token_labels") == "soft"
    out = {("tree_term" if key == "weights" else "lambda_tree" if key == "lambda_exit" else key): value
           for key, value in config.items() if key != "token_labels"}
    out["soft_top"] = config.get("soft_top", 0) if soft else 0
    return out


def _kept(by_name):
    """Drafter name -> value, with the kept drafter named ``adapted``."""
    return {(_KEPT if name == _KEPT_BEFORE else name): value for name, value in by_name.items()} if isinstance(by_name, dict) else by_name


# ------------------------------------------------------------------------------ per kind
def _exittrain(data: dict) -> dict:
    """An ExitTrain report (``exittrain.json``): settings, ``tau_bound``, the history's tree loss, rows, the ablation table."""
    data = _tau_bound_keys(data)
    if "config" in data and "settings" not in data:
        data = {("settings" if key == "config" else key): (_settings(value) if key == "config" else value) for key, value in data.items()}
    if isinstance(data.get("history"), list):
        data["history"] = [{("loss_tree" if key == "loss_exit" else key): value for key, value in step.items()} for step in data["history"]]
    if isinstance(data.get("tau"), dict):
        data["tau"] = {name: _rows(rows) for name, rows in data["tau"].items()}
    if "domain_rows" in data:
        data["domain_rows"] = _rows(data["domain_rows"])
    if isinstance(data.get("ablation"), str):
        data["ablation"] = data["ablation"].replace(_OLD_ABLATION_HEADER, _ABLATION_HEADER)
    return data


def _workload(result: dict) -> dict:
    """One pack's adaptation: the kept drafter ``adapted``, ``tau_bound``, cells of the mean block length."""
    result = _tau_bound_keys(result)
    for key in _WORKLOAD_LAWS:
        if isinstance(result.get(key), dict):
            result[key] = {name: _block_length_row(cell) for name, cell in _kept(result[key]).items()}
    for group in ("gain", "tau_bound"):
        if isinstance(result.get(group), dict):
            result[group] = {key: _kept(cells) for key, cells in result[group].items()}
    if "heldout_mass" in result:
        result["heldout_mass"] = _kept(result["heldout_mass"])
    return result


def _build(data: dict) -> dict:
    """The tiny pair's build report: its drafter's shape and training settings, history, evaluation rows."""
    config = dict(data["config"])
    if "drafter" not in config and "drafter_window" in config:
        config["drafter"] = {new: config.pop("drafter_" + old) for old, new in _OLD_SHAPE.items() if "drafter_" + old in config}
    if "drafter_training" not in config and "drafter_steps" in config:
        config["drafter_training"] = {key: config.pop("drafter_" + key) for key in ("steps", "batch", "lr") if "drafter_" + key in config}
    data = {**data, "config": config}
    history = data.get("drafter", {}).get("history")
    if isinstance(history, list):  # the distillation loop before the one trainer kept its running loss as "loss"
        data["drafter"] = {**data["drafter"], "history": [
            {("running_loss" if key == "loss" and "running_loss" not in step else key): value for key, value in step.items()} for step in history]}
    evaluation = dict(data.get("evaluation", {}))
    for key in ("tau", "horizons", "humaneval_tau"):
        if key in evaluation:
            evaluation[key] = _rows(evaluation[key])
    return {**data, "evaluation": evaluation}


def _recipe(recipe: dict) -> dict:
    """A training recipe with its drafter shape under ``drafter`` and its training settings under ``train``."""
    if "drafter" in recipe:
        return recipe
    out = {key: value for key, value in recipe.items() if key not in _OLD_SHAPE and key not in _OLD_TRAIN}
    out["drafter"] = {new: recipe[old] for old, new in _OLD_SHAPE.items() if old in recipe}
    out["train"] = {key: recipe[key] for key in _OLD_TRAIN if key in recipe}
    return out


def _training(data: dict) -> dict:
    """A drafter's ``training.json``: its recipe and ``tau`` rows (and a previous build's)."""
    data = {**data, "recipe": _recipe(data["recipe"]), "tau": _rows(data["tau"])}
    if isinstance(data.get("previous_build"), dict):
        data["previous_build"] = {**data["previous_build"], "tau": _rows(data["previous_build"].get("tau"))}
    return data


def _e2e(data: dict) -> dict:
    """An end-to-end benchmark (``bench e2e --json``) or an ablation (``bench exittrain``): its rows."""
    return {**_tau_bound_keys(data), "rows": _rows(data["rows"])}


def _report(data: dict) -> dict:
    """The claims report: its sweep's and end-to-end rows, its workload packs' cells and gains."""
    measurements = dict(data["measurements"])
    for key in ("sweep", "e2e"):
        if isinstance(measurements.get(key), dict) and "rows" in measurements[key]:
            measurements[key] = {**measurements[key], "rows": _rows(measurements[key]["rows"])}
    workload = measurements.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("packs"), dict):
        packs = {pack: {law: ({**part, "cells": {name: _block_length_row(cell) for name, cell in _kept(part["cells"]).items()}, "gain": _kept(part["gain"])}
                              if isinstance(part, dict) and "cells" in part else part) for law, part in laws.items()}
                 for pack, laws in workload["packs"].items()}
        measurements["workload"] = {**workload, "packs": packs, "mean_gain": {law: _kept(gains) for law, gains in workload.get("mean_gain", {}).items()}}
    return {**data, "measurements": measurements}


def _measurement(data: dict) -> dict:
    """A documented measurement whose script is gone: its rows, and each variant's ExitTrain settings."""
    data = _tau_bound_keys(data)
    if "rows" in data:
        data["rows"] = _rows(data["rows"])
    return {key: ({("settings" if k == "config" else k): (_settings(v) if k == "config" else v) for k, v in value.items()}
                  if isinstance(value, dict) and isinstance(value.get("config"), dict) else value) for key, value in data.items()}


_MIGRATIONS = {
    "build": _build, "training": _training, "exittrain": _exittrain, "ablation": _e2e, "workload": _workload, "e2e": _e2e, "report": _report,
    "measurement": _measurement,
    "workload-table": lambda table: {"packs": {pack: {**entry, "result": _workload(entry["result"])} for pack, entry in table.items()}},
}


# ------------------------------------------------------------------------------ version steps
def _renamed(data: dict, old: str, new: str) -> dict:
    """``data`` with its top-level key ``old`` named ``new`` where it stood (a new dict; the order kept)."""
    return {(new if key == old else key): value for key, value in data.items()}


def _adapt_command(command):
    """A recorded workload adaptation's command line with today's subcommand (``exittrain --workload`` is ``adapt --workload``)."""
    if isinstance(command, str) and command.startswith(_EXITTRAIN_COMMAND) and "--workload" in command.split():
        return _ADAPT_COMMAND + command[len(_EXITTRAIN_COMMAND):]
    return command


def _workload_2(result: dict) -> dict:
    result = _renamed(result, "minutes_budget", "minutes_allowed")
    if "command" in result:
        result["command"] = _adapt_command(result["command"])
    return result


def _workload_table_2(table: dict) -> dict:
    packs = table.get("packs")
    if isinstance(packs, dict):
        table["packs"] = {pack: {**entry, "command": _adapt_command(entry.get("command"))} if isinstance(entry, dict) and "command" in entry else entry
                          for pack, entry in packs.items()}
    return table


def _figures_named(value):
    """``value`` with every row measured before tau counted tokens per forward (``mean_block_length``,
    a number or null, and no ``tau``, at any depth) naming its figure (the last key)."""
    if isinstance(value, list):
        return [_figures_named(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: _figures_named(item) for key, item in value.items()}
    if BLOCK_LENGTH in out and not isinstance(out[BLOCK_LENGTH], (dict, list)) and TAU not in out:
        out[FIGURE_KEY] = BLOCK_LENGTH
    return out


def _training_2(data: dict) -> dict:
    """Rows name their figure; ``resumed`` is said, null where the run did not record what it read (after ``timings_s``)."""
    data = _figures_named(data)
    if "resumed" in data:
        return data
    out = {}
    for key, value in data.items():
        out[key] = value
        if key == "timings_s":
            out["resumed"] = None
    return out if "resumed" in out else {**out, "resumed": None}


# (kind, version) -> the step that rewrites that version of a result as the next version
_UPGRADES = {
    ("workload", 1): _workload_2,
    ("workload-table", 1): _workload_table_2,
    ("workload-path", 1): lambda result: _renamed(result, "minutes_budget", "minutes_allowed"),
    ("gpu-check", 1): lambda result: _renamed(result, "budget_seconds", "seconds_allowed"),
    ("training", 1): _training_2,
    **{(kind, 1): _figures_named for kind in ("build", "exittrain", "ablation", "e2e", "report", "measurement")},
    ("workload", 2): _figures_named,
    ("workload-table", 2): _figures_named,
}


def _upgraded(data: dict, kind: str, version: int) -> dict:
    """``data``, a result of ``kind`` at ``version``, rewritten step by step as the current version (unstamped)."""
    for step in range(version, VERSIONS[kind]):
        data = _UPGRADES.get((kind, step), lambda d: d)(data)
    return data


# ------------------------------------------------------------------------------ which kind
def _kind_by_keys(data: dict) -> str | None:
    """The kind of an unversioned result from the keys its writer always wrote (None: not a result)."""
    def has(*keys):
        return all(key in data for key in keys)

    values = list(data.values())
    if values and all(isinstance(v, dict) and {"task", "command", "result"} <= set(v) for v in values):
        return "workload-table"
    checks = (("report", ("claims", "measurements")), ("build", ("config", "target", "drafter", "evaluation")),
              ("training", ("recipe", "heldout", "tau")), ("workload", ("T0", "T1", "gain")), ("e2e", ("rows", "weight_read", "truncation")),
              ("loadtest", ("levels", "server_alive_at_end")), ("page-speed", ("omp_wait_policy", "rows")), ("row-cost", ("cpu_capability", "operations")),
              ("reach", ("teacher_forced", "decoding")), ("exittrain", ("steps_done", "seconds")), ("ablation", ("rows", "heldout_trees")))
    return next((kind for kind, keys in checks if has(*keys)), None)


def detect_kind(path: Path, data) -> str | None:
    """The kind of an unversioned stored result at ``path`` (None for a file that is no result:
    prompts, model configs, workload packs). The measurements whose scripts are gone are named by file."""
    if not isinstance(data, dict) or path.name in ("drafter_config.json", "config.json", "generation_config.json") or "tokenizer" in path.name:
        return None
    if path.stem in ("bf16-divergence", "sampling-defaults", "exittrain-diagnosis"):
        return "measurement"
    return _kind_by_keys(data)


def migrate_data(data: dict, kind: str) -> dict:
    """An unversioned result of ``kind`` in today's names, stamped with its schema (a new dict)."""
    return stamped(kind, _upgraded(_MIGRATIONS.get(kind, lambda d: d)(json.loads(json.dumps(data))), kind, 1))


def upgrade_data(data: dict) -> dict:
    """A versioned result of an older version of its kind's schema in today's names, stamped with
    the current version (a new dict); ValueError for an unknown kind or a version from the future."""
    kind, _, version = str(data[SCHEMA_KEY]).rpartition("/")
    if kind not in VERSIONS or not version.isdigit() or not 1 <= int(version) <= VERSIONS[kind]:
        raise ValueError(f"unknown schema {data[SCHEMA_KEY]!r}; kinds: {', '.join(f'{k}/{v}' for k, v in VERSIONS.items())}")
    return stamped(kind, _upgraded(json.loads(json.dumps(data)), kind, int(version)))


def _drafter_notes(data: dict) -> dict:
    """A drafter config whose ``notes.exittrain`` settings have today's names."""
    notes = data.get("notes")
    if not isinstance(notes, dict) or not isinstance(notes.get("exittrain"), dict):
        return data
    return {**data, "notes": {**notes, "exittrain": _settings(notes["exittrain"])}}


def _indent_of(text: str) -> int:
    """The indent a JSON file was written with (1 when it holds one line)."""
    second = text.split("\n", 2)[1] if text.count("\n") >= 1 else ""
    return max(1, len(second) - len(second.lstrip(" ")))


def migrate_file(path: str | Path, kind: str | None = None, dry_run: bool = False) -> str:
    """Rewrite the result at ``path`` in today's names once; returns what was done, in words.
    ``kind`` overrides what :func:`detect_kind` reads from the file; a versioned file is brought to
    its kind's current version (one at it is left as it is)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    if isinstance(data, dict) and SCHEMA_KEY in data:
        try:
            new = upgrade_data(data)
        except ValueError as error:
            return f"{path}: {error}; left alone"
        if new[SCHEMA_KEY] == data[SCHEMA_KEY]:
            return f"{path}: already {data[SCHEMA_KEY]}"
        label = f"{data[SCHEMA_KEY]} -> {new[SCHEMA_KEY]}"
    elif path.name == "drafter_config.json":
        new = _drafter_notes(data)
        label = "drafter config notes"
    else:
        kind = kind or detect_kind(path, data)
        if kind is None:
            return f"{path}: not a stored result; left alone"
        if kind not in VERSIONS:
            raise ValueError(f"unknown result kind {kind!r}; kinds: {', '.join(VERSIONS)}")
        new, label = migrate_data(data, kind), kind
    if new == data:
        return f"{path}: nothing to rename"
    if not dry_run:
        write_text_atomic(path, json.dumps(new, indent=_indent_of(text), ensure_ascii=True) + ("\n" if text.endswith("\n") else ""))
    return f"{path}: {'would migrate' if dry_run else 'migrated'} as {label}"


def migrate_command(args) -> int:
    """Migrate every file named (folders: every ``*.json`` under them); prints one line a file."""
    paths = [p for name in args.paths for p in (sorted(Path(name).rglob("*.json")) if Path(name).is_dir() else [Path(name)])]
    for path in paths:
        print(migrate_file(path, args.kind, args.dry_run))
    return 0
