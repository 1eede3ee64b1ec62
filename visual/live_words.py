"""The Live tab's words: what the stats, the line under the buttons and the round browser say of a run, every
number from the run's rounds, its summary and its timing (:class:`~tev.engine.run_speed.Speed`); the sentences only
(:mod:`tev.service.live_runs` runs the protocol, ``ui.live`` draws it).

``p`` is the target, ``q`` the drafter; a run's ``records`` are its rounds
(:class:`~tev.engine.round.RoundRecord`), its ``summary`` a :class:`~tev.engine.decode.GenerationSummary`.
"""

from __future__ import annotations

import time

from tev.engine.decode import DecodeConfig, GenerationSummary
from tev.engine.run_speed import MIN_TIMED_TOKENS, Machine, Speed
from tev.util.compute_thread import BACKGROUND_SHARE

__all__ = ["STAGE_LABELS", "STOPPED", "RETIMING", "UNMEASURED", "stats_markdown", "speed_line",
           "speed_verdict", "not_retimed", "run_summary", "sharing_note", "said_at_end", "teaching_round", "opened_at", "round_info"]


# A round's stages as the engine names them (their times sum to the round's), in the order they run.
STAGE_LABELS = {"draft": "draft", "build": "tree build", "forward": "target forward", "head": "head (rows, truncation)", "verify": "verify", "commit": "commit"}
UNDRAFTED = ("draft", "build")  # at budget 0 nothing is drafted or built: these stages are not named
STOPPED = {"eos": "the answer ended", "stop_string": "a stop string", "cancelled": "you pressed Stop", "context_limit": "the target's context is full"}
# While the finished answer is timed again; then, when that did not end, why there is no speed.
RETIMING = ("**re-timing**: speculation and plain decoding run again on this prompt, timed, while the page draws nothing… "
            "press Stop to skip it, or Generate to skip it and start a new run")
UNMEASURED = {
    "ended": "**speed not measured**: you pressed Stop as the answer ended, so it was not re-timed against plain decoding.",
    "stop": "**speed not measured**: you pressed Stop during the re-timing (speculation and plain decoding run again, timed), so there is no speedup to give.",
    "generate": "**speed not measured**: you pressed Generate during the re-timing, which ends it; your new run starts now.",
}


def stats_markdown(records, summary: GenerationSummary | None, config: DecodeConfig | None = None, speed: Speed | None = None,
                   machine: Machine = Machine()) -> str:
    """The stats' sentences; ``speed`` what is known of the finished run's speed (:class:`Speed`), ``machine`` what it ran on."""
    if not records:
        return "No rounds yet."
    lengths = [r.block_length for r in records]
    bounds = [r.flow.tau_bound for r in records]
    tokens = sum(len(r.emitted) for r in records)
    lines = [
        f"**rounds** {len(records)} · **tokens** {tokens} · **tau** {tokens / len(records):.2f} · **mean block length** {sum(lengths) / len(lengths):.2f} · "
        f"**mean 1 + C** {sum(bounds) / len(bounds):.2f}",
        "tau = tokens the answer got per target forward; a block (accepted draft tokens + the bonus token) can run past the answer's end, "
        "and its mean length is what 1 + C bounds; see the Learn tab for other tools' figures.",
    ]
    if records[-1].choice is not None:
        lines.append(_auto_line(records))
    if summary is not None:
        lines.append(_stopped_line(summary, config, speed))
    said = speed_line(speed, config, machine)
    if said:
        lines.append(said)
    elif summary is not None and summary.stop_reason == "cancelled" and config is not None:
        lines.append("No speed comparison: you pressed Stop, so the answer was not timed again against plain decoding (only an answer "
                     "that ends on its own is: a cut one would time a different length).")
    elif summary is not None and _added(speed, tokens) < MIN_TIMED_TOKENS and config is not None:
        lines.append(f"No speed comparison: {_added(speed, tokens)} tokens{' (this Continue added)' * _continued(speed, tokens)} are too few to time (it needs at least {MIN_TIMED_TOKENS}; over a few "
                     "steps the first step's warm-up and the machine's jitter would decide the ratio).")
    return "\n\n".join(lines)


def _added(speed: Speed | None, tokens: int) -> int:
    """The tokens the last press added: a Continue's own, else the whole answer's ``tokens``."""
    return speed.added if speed is not None and speed.added is not None else tokens


def _continued(speed: Speed | None, tokens: int) -> bool:
    return _added(speed, tokens) != tokens


def _stopped_line(summary: GenerationSummary, config: DecodeConfig | None, speed: Speed | None) -> str:
    """Why the run stopped, its time to first token, and the rate the page received its text at."""
    stopped = STOPPED.get(summary.stop_reason, summary.stop_reason)
    if summary.stop_reason == "max_new_tokens":
        stopped = f"at the length limit ({config.max_new_tokens} new tokens): the answer may be cut short; press **Continue** to let it go on"
    rate = speed.shown if speed is not None and speed.shown is not None else summary.tokens_per_second
    waited, crowd = (speed.waited, speed.crowd) if speed is not None else (0.0, 0)
    line = f"stopped: {stopped} · time to first token {1e3 * (waited + summary.time_to_first_token):.0f} ms"
    line += f" ({waited:.1f} s of it in this app's line behind other runs)" if waited >= 0.5 else ""
    line += f" · {rate:.1f} tokens/s as this page received the answer, from the press"
    if crowd:
        line += f" ({crowd} other run{'s' * (crowd > 1)} shared the machine while it streamed: each took its turn between its rounds)"
    return line


def speed_line(speed: Speed | None, config: DecodeConfig | None, machine: Machine = Machine()) -> str | None:
    """The speed comparison's sentence: this answer timed again, or why it was not (with the machine's latest idle
    figure when a crowd kept it from being timed); None when there is nothing to say."""
    if speed is None:
        return None
    if speed.timing is not None and speed.timing.measured:
        own = (speed.added / speed.rounds, speed.continued) if speed.rounds else None
        machine = machine.ran_at(speed.timing.threads)
        return speed_verdict(speed.timing.speculative, speed.timing.autoregressive, config, speed.timing.others, speed.load, own, machine)
    if speed.unmeasured == "busy":
        return not_retimed(speed.waiting, speed.recalled, config)
    return UNMEASURED.get(speed.unmeasured) if speed.unmeasured else None


def not_retimed(waiting: int, recalled, config: DecodeConfig) -> str:
    """Why an answer was not re-timed (``waiting`` other runs in the app's line), and this machine's latest idle
    re-timing of the same kind of run, named as such (never as this answer's timing)."""
    runs = f"{waiting} other run{'s were' if waiting > 1 else ' was'}"
    head = (f"**speed not re-timed**: {runs} in this app's line as your answer ended, and re-timing it (speculation and plain decoding "
            f"again, on this machine's shared cores) would have held {'them' if waiting > 1 else 'it'} up.")
    if recalled is None:
        return head + "\n\nNo re-timing of this kind of run has yet run alone here: generate again when the page is quiet for one."
    spec, plain = recalled.timing.speculative, recalled.timing.autoregressive
    minutes = max(0.0, time.time() - recalled.at) / 60
    return (head + f"\n\nThis machine's latest re-timing of the same kind of run that had the app to itself (another answer, {minutes:.0f} min ago; "
            f"load average {recalled.load:.1f} on {recalled.cpus} CPUs then): speculation {spec.tokens_per_second:.1f} tokens/s, plain decoding "
            f"{plain.tokens_per_second:.1f} tokens/s → **{spec.tokens_per_second / max(plain.tokens_per_second, 1e-9):.2f}x** (tau {spec.tau:.2f}).")


def run_summary(records, summary: GenerationSummary | None, speed: Speed | None = None, machine: Machine = Machine()) -> dict:
    """The run in numbers, beside :func:`stats_markdown`'s sentences: rounds, tokens, tau (tokens
    emitted per target forward), mean block length, mean 1 + C, the drafter, how it stopped and its speed: ``timing`` this
    answer's rerun against plain decoding (``others``: the most other requests that shared the machine meanwhile), else
    ``not_retimed_for`` (other runs in the app's line as it ended) and ``idle_timing``, the machine's latest lone re-timing."""
    timing = speed.timing if speed is not None else None
    tokens = sum(len(r.emitted) for r in records)
    found = {"rounds": len(records), "tokens": tokens, "tau": tokens / len(records), "mean_block_length": sum(r.block_length for r in records) / len(records),
             "mean_tau_bound": sum(r.flow.tau_bound for r in records) / len(records), "drafter": records[-1].drafter,
             "stop_reason": None, "time_to_first_token_s": None, "tokens_per_second": None, "timing": None, "not_retimed_for": None, "idle_timing": None,
             "waited_in_line_s": None, "shared_with": None}
    if summary is not None:
        shown = speed.shown if speed is not None and speed.shown is not None else summary.tokens_per_second
        waited = speed.waited if speed is not None else 0.0
        found.update(stop_reason=summary.stop_reason, time_to_first_token_s=waited + summary.time_to_first_token, tokens_per_second=shown,
                     waited_in_line_s=waited, shared_with=speed.crowd if speed is not None else 0)
    if speed is not None and speed.unmeasured == "busy":
        found["not_retimed_for"] = speed.waiting
        if speed.recalled is not None:
            spec, ar = speed.recalled.timing.speculative, speed.recalled.timing.autoregressive
            found["idle_timing"] = {"speculative_tokens_per_second": spec.tokens_per_second, "autoregressive_tokens_per_second": ar.tokens_per_second,
                                    "age_s": time.time() - speed.recalled.at, "load": speed.recalled.load}
    if timing is not None and timing.measured:
        spec, ar = timing.speculative, timing.autoregressive
        found["timing"] = {"speculative_tokens_per_second": spec.tokens_per_second, "autoregressive_tokens_per_second": ar.tokens_per_second,
                           "speedup": spec.tokens_per_second / max(ar.tokens_per_second, 1e-9), "tau": spec.tau, "others": timing.others,
                           "threads": machine.ran_at(timing.threads).threads, "thread_counts": list(timing.threads)}
    return found


def _auto_line(records) -> str:
    """How budget auto sized this run's trees, and the cost curve it weighed them against."""
    sizes = [r.tree.size for r in records]
    choice = records[-1].choice
    cost = choice.cost  # seconds of a round whose forward holds n = 1 .. M + 1 tokens
    steps = " · ".join(f"{n} tokens {float(cost[n - 1] / cost[0]):.2f}" for n in (2, 5, 9, 17, 33) if n <= len(cost))
    plain = sum(1 for k in sizes if k == 0)
    return (f"**budget auto** (cap {choice.cap}): kept {sum(sizes) / len(sizes):.1f} nodes a round on average (from {min(sizes)} to {max(sizes)}; "
            f"{plain} of {len(sizes)} rounds plain decoding). A round whose forward holds n tokens costs here, in plain-decoding rounds: {steps}; "
            f"the drafter's path probabilities are scaled by c = {choice.calibration:.2f} (realised coverage over the drafter's estimate so far).")


def sharing_note(active: int, background: int = 0) -> str:
    """While a run streams: how many other requests the compute thread steps in turn with it
    (``active`` in all, ``background`` of them fine-tunes or measuring runs, which step after your rounds)."""
    others = active - 1 - background
    notes = []
    if others > 0:
        notes.append(f"{others} other run{'s' if others > 1 else ''} share{'' if others > 1 else 's'} the machine now: each takes its turn between your rounds")
    if background > 0:
        notes.append(f"{'a' if background == 1 else background} background run{'s' * (background > 1)} (fine-tuning, measuring) share{'s' * (background == 1)} the "
                     f"machine now: your rounds go first, and {'it gets' if background == 1 else 'they get'} about {BACKGROUND_SHARE:.0%} of its time")
    if not notes:
        return ""
    return ("\n\n" + "; ".join(notes) + ", so this run is slower than it would be alone (the speed comparison is timed again after the answer, "
            "and says whether the machine was shared then).")


def _timed_how(others: int) -> str:
    """How the rerun was timed: with no other run in the app's line, or beside ``others`` other requests (what the
    app measured of itself)."""
    if others > 0:
        return f"timed again while {others} other run{'s' if others > 1 else ''} shared the machine"
    return "timed again with no other run in this app's line"


def _load_note(load: tuple[float, int] | None, threads: int) -> str:
    """The machine's ``load`` (load average, CPUs) as the rerun began, which counts every process: a cause beside the
    measured ones, never in place of them."""
    if load is None:
        return ""
    average, cpus = load
    if average > threads + 0.5:  # more than this app's own threads keep the cores busy
        return (f" As it began, other processes loaded the machine (load average {average:.1f} on {cpus} CPUs): they took time from "
                "both runs, and a quiet machine gives more.")
    return f" The machine's load average was {average:.1f} on {cpus} CPUs as it began."


def _tau_named(tau: float, own: tuple[float, bool] | None, budget_is_auto: bool) -> str:
    """The re-timing's tau, named as its own, beside the answer's (``own``: its tau and whether it was a Continue's part)."""
    said = f"**tau {tau:.2f}** tokens"
    if own is None:
        return said
    own_tau, continued = own
    whose = "this Continue's rounds" if continued else "the answer's rounds"
    if abs(own_tau - tau) < 0.005:
        return said + f" (as {whose})"
    why = ": budget auto sized the re-timing's trees by that moment's clock" if budget_is_auto else ""
    return said + f" ({whose} above gave tau {own_tau:.2f}{why})"


def speed_verdict(spec: GenerationSummary, ar: GenerationSummary, config: DecodeConfig, others: int = 0, load: tuple[float, int] | None = None,
                  own: tuple[float, bool] | None = None, machine: Machine = Machine()) -> str:
    """The speed of a rerun against plain decoding and, in the same first paragraph, its measured reason (a round's
    cost in one-token steps against the tokens it gave); then the rerun's stage times and what else weighed.
    ``others`` the most other requests that shared the machine during it (they took turns with its rounds), ``load``
    the machine's load average and CPUs as it began, ``own`` the answer's tau (see :func:`_tau_named`)."""
    timed = _timed_how(others)
    speedup = spec.tokens_per_second / max(ar.tokens_per_second, 1e-9)
    step_ms = 1e3 * (ar.seconds - ar.prefill_seconds) / max(1, len(ar.token_ids))  # one target step
    round_ms = 1e3 * (spec.seconds - spec.prefill_seconds) / max(1, spec.rounds)
    steps = round_ms / max(step_ms, 1e-9)
    ran = [key for key in STAGE_LABELS if key in spec.stage_seconds and not (config.budget == 0 and key in UNDRAFTED)]
    stages = " · ".join(f"{STAGE_LABELS[key]} {1e3 * spec.stage_seconds[key] / max(1, spec.rounds):.0f} ms" for key in ran)
    same = "the same text" if config.temperature == 0 else "the same settings and seed (plain decoding samples its own text)"
    threads = machine.described()
    if config.budget == 0:
        return (f"**speed, {timed}** on {threads}, same prompt and {same}: budget 0 drafts nothing, so both runs are "
                f"plain decoding, one token per target forward: the round loop {spec.tokens_per_second:.1f} tokens/s, the plain loop "
                f"{ar.tokens_per_second:.1f} tokens/s. A round cost {round_ms:.0f} ms ({stages}), a plain step {step_ms:.0f} ms.{_load_note(load, machine.threads)}")
    head = (f"**speed, {timed}** on {threads}, same prompt and {same}: speculation "
            f"{spec.tokens_per_second:.1f} tokens/s, plain decoding {ar.tokens_per_second:.1f} tokens/s → **{speedup:.2f}x**. "
            f"Why: a round of the re-timing cost **{steps:.1f} one-token steps** and gave {_tau_named(spec.tau, own, config.budget == 'auto')}; "
            f"speculation gains about tau over a round's steps ({spec.tau:.2f} / {steps:.1f} = {spec.tau / max(steps, 1e-9):.2f}).")
    why = f"A round cost {round_ms:.0f} ms, a one-token step {step_ms:.0f} ms: {stages}."
    if speedup < 1 and config.budget == "auto":
        fixed = sum(1e3 * spec.stage_seconds.get(key, 0.0) for key in ("draft", "build", "head", "verify")) / max(1, spec.rounds)
        why += (f" Speculation did not pay on this prompt, on this machine: budget auto kept only the nodes its measured cost curve "
                f"said would pay, yet each round's fixed work (the drafter's pass and the decision, {fixed:.0f} ms here) was more than "
                f"the drafter's reach on this text gave back (tau {spec.tau:.2f}). A prompt the drafter predicts well (code, lists, "
                "a workload it was adapted to) or T = 0 pays; on a GPU a tree forward costs about one step.")
    elif speedup < 1:
        why += (" Speculation pays only when a round yields more tokens than it costs steps: here it does not. On a CPU a "
                "forward over the B + 1 tree tokens costs more than a one-token step (on a GPU about the same); a smaller "
                "budget, T = 0, or a prompt the drafter predicts well (code, lists) shifts the balance.")
    if others > 0:
        why += (f" {others} other run{'s' if others > 1 else ''} took turns with this rerun's rounds on the machine: the figures above are "
                "lower than it gives one run alone; generate again on a quiet machine for that speed.")
    return head + "\n\n" + why + _load_note(load, machine.threads)


def said_at_end(summary: GenerationSummary, config: DecodeConfig, speed: Speed, machine: Machine = Machine()) -> str:
    """Under the buttons at a run's end: how it stopped, and the speed comparison's first sentence."""
    stopped = ("at the length limit (max new tokens): press **Continue** to go on" if summary.stop_reason == "max_new_tokens"
               else STOPPED.get(summary.stop_reason, summary.stop_reason))
    said = speed_line(speed, config, machine)
    return f"stopped: {stopped}" + ("\n\n" + said.split("\n\n")[0] if said else "")


def _spread(record) -> bool:
    """Whether a round's target mass leaves its tree at more than one node (its exit law is not all on one node)."""
    return record.tree.size > 0 and float(record.flow.exit_weight.max()) < 1 - 1e-3


def teaching_round(records) -> int:
    """The round a visitor learns most from: among the rounds whose target mass leaves the tree at more than one
    node (a round with all its mass on one path draws reach 1 or 0 at every node and a whole-number coverage: nothing
    to see in the colours), the one whose tree holds the most target mass (largest C(T)), then the fullest tree; when
    no round spreads its mass, the most mass. The last round, shown before, was often a stub (B = 1-2, C = 0) as the
    answer ran out; ties go to the earliest."""
    return max(range(len(records)), key=lambda i: (_spread(records[i]), records[i].flow.coverage, records[i].tree.size, -i))


def opened_at(records, shown: int, greedy: bool = False) -> str:
    """Which round the figures open at, and why (nothing when no round drafted a node: every round is the root alone);
    ``greedy``: the run decoded at T = 0 (where every round's mass leaves at one node)."""
    record = records[shown]
    if record.tree.size == 0:
        return ""
    where = f"\n\nThe tree above is round {shown + 1} of {len(records)} (B = {record.tree.size}, C(T) = {record.flow.coverage:.3f})"
    if _spread(record):
        spread = sum(_spread(r) for r in records)
        return (f"{where}, chosen to teach: the most target mass among the {spread} round{'s' * (spread != 1)} whose mass leaves the tree at "
                "more than one node; browse every round with the slider below it.")
    return (f"{where}, the most target mass of the run: in every round the target was sure along one path, so its mass left the tree at one "
            f"node and each reach is 1 or 0{' (as always at T = 0)' if greedy else ''}; a higher T or top-p "
            "spreads it. Browse every round with the slider below it.")


def round_info(record) -> str:
    """The round browser's sentence on one round: its numbers, what kind of tree it is when it teaches little (its mass
    on one path, a one-deep fan), and budget auto's choice."""
    info = (
        f"round {record.index + 1}: budget {record.tree.size}, coverage C = {record.flow.coverage:.3f}, 1 + C = {record.flow.tau_bound:.3f}, "
        f"block length L = {record.block_length} (accepted {len(record.accepted_tokens)} + bonus), exit node {record.verdict.exit_node} "
        f"at depth {int(record.tree.depths[record.verdict.exit_node])}"
    )
    if record.tree.size > 0 and not _spread(record):
        info += (" · **its mass on one path**: the target was sure of each drafted token along one path and of none beside it (at T = 0 "
                 "it always is), so all its mass leaves the tree at one node and each reach is 1 or 0")
    elif record.tree.size > 1 and int(record.tree.depths.max()) == 1:
        info += f" · **a one-deep fan**: all {record.tree.size} nodes are guesses of the next token alone, none drafted past it"
    if record.choice is not None:
        info += "\n\n" + _choice_sentence(record)
    return info


def _choice_sentence(record) -> str:
    """Budget auto's choice for one round, in words (every number from ``record.choice``)."""
    choice = record.choice
    k, drafted = choice.size, len(choice.path_prob)
    kept = "plain decoding (no node)" if k == 0 else f"the drafter's best {k} of {drafted} nodes"
    return (f"budget auto chose **{k}**: {kept}, cap {choice.cap}. Expected block 1 + c·Σq = {float(choice.expected[k]):.2f} tokens "
            f"(the drafter's Σq = {choice.estimate:.2f}, calibration c = {choice.calibration:.2f}) for a round of {1e3 * float(choice.cost[k]):.0f} ms; "
            f"a node was kept while its expected tokens paid for its time at {choice.going_rate:.1f} tokens/s, the rate of the rounds before it.")
