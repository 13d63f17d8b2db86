"""Chaos trials against the real CLI: SIGKILLs at random and aimed instants, a flaky S3, runs racing each
other and a naive mirror; every trial must converge on re-run with no invariant broken, no traceback and
no leaked secret (see tests/chaos/harness.py). Bounded and seeded; ``bench/chaos.py`` is the long mode."""

from __future__ import annotations

import pytest

from tests.chaos.harness import Aim, Lab, TrialResult, TrialSpec, run_trial

pytestmark = pytest.mark.slow

SPECS = [
    TrialSpec("random-kill", "random-kill-at-1.1s", seed=1, delay=1.1),  # a compaction here takes 1.6 s at its fastest
    *(TrialSpec("aimed-kill", f"aimed-kill-{Aim(step, phase, nth)}", seed=2, aim=Aim(step, phase, nth))
      for step, nth in (("backup-copy", 2), ("log-swap", 1), ("index-put", 2))
      for phase in ("before", "after") if (step, phase) != ("backup-copy", "before")),
    TrialSpec("aimed-kill", "aimed-kill-rollback-after-log-swap#2", seed=2, aim=Aim("log-swap", "after", 2),
              victim="rollback"),
    TrialSpec("aimed-kill", "aimed-kill-after-index-delete-then-cleanup", seed=3, aim=Aim("index-delete", "after"),
              recover="cleanup"),
    TrialSpec("flaky", "flaky-12pct", seed=4, rate=0.12),
    TrialSpec("concurrent", "concurrent-two-compactions", seed=5, workers=2),
    TrialSpec("concurrent", "concurrent-stalled-before-backup-copy-while-another-takes-over", seed=5,
              aim=Aim("backup-copy", "before")),
    TrialSpec("concurrent", "concurrent-stalled-after-index-delete-while-another-takes-over", seed=5,
              aim=Aim("index-delete", "after")),
    TrialSpec("rollback-race", "rollback-race-beside-compaction", seed=6),
    TrialSpec("mirror", "mirror-after-log-swap", seed=7, mirror="after-log-swap"),
    TrialSpec("mirror", "mirror-split", seed=8, mirror="split"),
    TrialSpec("rerun-kill", "rerun-kill-after-log-swap-then-before-index-put", seed=9, aim=Aim("log-swap", "after"),
              aim2=Aim("index-put", "before")),
]


@pytest.fixture(scope="module")
def lab(moto_endpoint: str) -> Lab:
    return Lab(moto_endpoint)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_trial_converges_with_no_bad_outcome(lab: Lab, spec: TrialSpec) -> None:
    result: TrialResult = run_trial(lab, spec)
    assert result.fired > 0 or spec.kind in ("concurrent", "rollback-race", "random-kill"), result.describe()
    if spec.kind == "concurrent" and spec.aim is not None:
        assert "compact B (while A stalls)" in [p.label for p in result.procs], result.describe()
    elif spec.kind == "random-kill" or spec.aim is not None:
        assert "killed" in result.exit_codes, result.describe()
    assert not result.bad, result.describe()
    assert result.converged, result.describe()
