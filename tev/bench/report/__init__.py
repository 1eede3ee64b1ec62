"""``python -m tev bench report``: the paper's claims checked on one model pair.

``p`` is the target and ``q`` the drafter, as everywhere. The report runs, on one
``ModelBundle``, one module per claim, each read top to bottom as measure -> rule -> table:

1. :mod:`.exit_law`: the exit law (Lemma 1) on real trees: ``sum_v w(v) = 1``, conservation,
   and TEV's exit-node frequencies against ``w`` (pooled chi-square);
2. :mod:`.coverage`: the coverage bound (Theorem 1): mean block length of each saturated
   verifier against ``1 + C(T)``, and a deliberately non-saturated exact verifier below it;
3. :mod:`.equivalence`: fixed-tree equivalence (Table 4): the verifiers' ``tau`` on identical trees;
4. :mod:`.latency`: the verifier-stage latency (Table 3): decision + cache commit, TEV vs predraw;
5. :mod:`.exittrain_gain`: the ExitTrain gain and ablation order (Tables 1 and 2);
6. :mod:`.budget_sweep`: the budget sweep (Table 5);
7. :mod:`.e2e_speed`: end-to-end speed against autoregressive decoding.

Claims 1-3 share the real trees of :mod:`.trees`; :mod:`.common` holds the settings and the
claim row, :mod:`.plots` the PNG plots, and :mod:`.assemble` measures everything and writes
``report.md`` and ``report.json``. Each claim gets a row ``claim | paper's figure | this run's
figure | holds?`` decided by a rule stated in the row's ``rule`` (never tuned to pass). Timing
comparisons interleave their methods in one run (shuffled order per repeat) and report
medians with the IQR.
"""

from tev.bench.report.assemble import add_arguments, build_report, run
from tev.bench.report.common import FULL, QUICK, ReportSettings

__all__ = ["ReportSettings", "QUICK", "FULL", "build_report", "add_arguments", "run"]
