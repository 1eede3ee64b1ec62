"""What is known of a finished run's speed: as the page received it, and as timed again against plain decoding;
and what it ran on.

The service measures it (:mod:`tev.service.live_runs`) and the page's words read it
(:mod:`visual.live_words`); both stand on this layer, so the record lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

from tev.util.cpus import threads_words

__all__ = ["Speed", "Machine", "MIN_TIMED_TOKENS"]

# Below this many tokens a tokens-per-second ratio is mostly noise (a few steps' jitter, the first step's warm-up): not timed.
MIN_TIMED_TOKENS = 32


@dataclass(frozen=True)
class Speed:
    """What the stats say of a finished run's speed."""

    shown: float | None = None  # tokens a second as the page received the answer (wall clock, the press to its last round)
    timing: object = None  # this answer timed again (the service's Retiming: its speculative and autoregressive summaries, others)
    load: tuple[float, int] | None = None  # the machine's load average and CPUs as it was timed again (machine_load)
    unmeasured: str | None = None  # why it was not (a key of UNMEASURED)
    waiting: int = 0  # other runs in the app's line as it ended, when it was not re-timed for them
    recalled: object = None  # then: the machine's latest idle re-timing of this kind of run, if any
    added: int | None = None  # the tokens this press added (a Continue's, not the whole answer's): what a re-timing times
    rounds: int | None = None  # the rounds that added them
    continued: bool = False  # the press was a Continue (the re-timing times its part of the answer)
    waited: float = 0.0  # seconds from the press to the run's start: in the app's line behind other runs
    crowd: int = 0  # the most other runs that shared the machine while it streamed


@dataclass(frozen=True)
class Machine:
    """What a run ran on, as the speed sentences name it: the torch ``threads`` every run is timed with, those
    threads in words (``threads_words``), and the target's forward and precision (``precision``, e.g. "row-invariant
    float32"; None before the models load)."""

    threads: int = 1
    threads_words: str = "1 torch thread"
    precision: str | None = None

    def described(self) -> str:
        return self.threads_words + (f", the target's {self.precision} forward" if self.precision else "")

    def ran_at(self, counts) -> "Machine":
        """This machine as a run that ran its steps with the torch thread ``counts`` saw it (empty: as it is)."""
        counts = sorted(set(counts))
        if not counts:
            return self
        words = threads_words(counts[-1])
        if len(counts) > 1:
            words += f" ({' or '.join(map(str, counts[:-1]))} while another process used a core)"
        return Machine(counts[-1], words, self.precision)
