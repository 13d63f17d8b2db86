"""A subset of the chaos trials on SeaweedFS (``tests/s3/seaweedfs.py``): a store that enforces a copy's
``If-Match``, so a run swaps by server-side copy there (on moto, by PUT), and the SIGKILLs land on that
path. The trials and their checks are test_chaos.py's; the store signs requests, so every process uses the
harness's credentials (the canary as the secret)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.chaos.harness import ACCESS_KEY, CANARY, Lab, TrialResult, TrialSpec, run_trial
from tests.chaos.test_chaos import SPECS
from tests.s3.seaweedfs import weed_mini

pytestmark = [pytest.mark.slow, pytest.mark.seaweedfs]

ON_SEAWEEDFS = ("random-kill-at-1.1s", "aimed-kill-after-backup-copy#2", "aimed-kill-before-log-swap",
                "aimed-kill-after-log-swap", "aimed-kill-rollback-after-log-swap#2", "flaky-12pct",
                "concurrent-two-compactions")
# A compaction of the trial's bucket takes about 1.4 s here against 2-3 s on moto: killed at 1.6 s it would
# have finished, so the random kill comes sooner.
CHOSEN = [replace(s, name="random-kill-at-0.9s", delay=0.9) if s.kind == "random-kill" else s
          for s in SPECS if s.name in ON_SEAWEEDFS]
assert len(CHOSEN) == len(ON_SEAWEEDFS), "a name above is not one of test_chaos.py's trials"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with weed_mini(tmp_path_factory.mktemp("seaweedfs"), access_key=ACCESS_KEY, secret_key=CANARY) as server:
        yield Lab(server.endpoint)


@pytest.mark.parametrize("spec", CHOSEN, ids=[s.name for s in CHOSEN])
def test_trial_on_seaweedfs_converges_with_no_bad_outcome(lab: Lab, spec: TrialSpec) -> None:
    result: TrialResult = run_trial(lab, spec)
    if spec.kind == "random-kill" or spec.aim is not None:
        assert "killed" in result.exit_codes, result.describe()
    assert not result.bad, result.describe()
    assert result.converged, result.describe()
