"""The fuzz targets in the ordinary test run: every regression input and seed replayed through each target
(the package's own build), and a bounded libFuzzer run of every target against the sanitized build: a fixed
seed and a fixed count of inputs per target, so that what a run tries does not depend on the clock or on
chance and a submission does not meet a finding by luck (`make fuzz` runs the open-ended campaign, seeded
anew each time). CI sets TIERING_REQUIRE_FUZZ=1: a missing clang or atheris fails there instead of skipping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import needs
from tests.fuzz import run
from tests.fuzz.targets import TARGETS

SEED = 20261201
# About twelve seconds each on this project's 2-core machine, start-up included.
RUNS = {"digest": 150_000, "keymap": 100_000, "merge": 100_000, "proof": 18_000, "scan": 12_000, "walk": 180_000,
        "zstd": 300_000}


def _unavailable(targets: list[str]) -> list[str]:
    """Of ``targets``, those whose compiled code did not load here (no libzstd to load at run time)."""
    from tests.fuzz.targets import NEEDS_LIBZSTD, _proof

    return [t for t in targets if t in NEEDS_LIBZSTD and not _proof.available()]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_and_regressions_pass_the_target(target: str) -> None:
    if _unavailable([target]):
        needs.missing(needs.LIBZSTD, "no libzstd: the compiled zstd proof does not run here")
    inputs = [*run.seeds(target), *(p.read_bytes() for p in run.regressions(target))]
    assert len(inputs) >= 5, f"{target}: too few seeds to start from"
    for data in inputs:
        TARGETS[target](data)


def test_a_finding_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The merge target caught the compiled merge answering None for a merge without records (fixed, kept as a
    regression); the same target fails on a merge_v2 that loses the last section's records."""
    from tests.fuzz import targets

    [empty] = run.regressions("merge")
    targets.merge(empty.read_bytes())
    seed = run.seeds("merge")[0]
    honest = targets._records

    class Lossy:
        digest_v2 = staticmethod(honest.digest_v2)

        @staticmethod
        def merge_v2(sections: list[bytes], *args: object) -> object:
            return honest.merge_v2([*sections[:-1], b""], *args)  # type: ignore[arg-type]

    monkeypatch.setattr(targets, "_records", Lossy)
    with pytest.raises(targets.Finding):
        targets.merge(seed)


@pytest.mark.clang
def test_every_target_runs_clean_under_the_sanitizers(tmp_path: Path) -> None:
    try:
        run.atheris_runtime()
        run.clang()
    except run.Missing as e:
        needs.missing(needs.FUZZ, str(e))
    out = tmp_path / "fuzz.json"
    assert sorted(RUNS) == sorted(TARGETS), "a run count for every target"
    missing = _unavailable(sorted(TARGETS))  # the others are fuzzed; then the test says these were not
    names = [t for t in sorted(TARGETS) if t not in missing]
    code = run.main(["--targets", *names, "--runs", *(str(RUNS[t]) for t in names),
                     "--seed", str(SEED),
                     "--corpus", str(tmp_path / "corpus"), "--artifacts", str(tmp_path / "findings"),
                     "--json", str(out)])
    results = json.loads(out.read_text())
    assert code == 0, [(r["target"], r["findings"], r["log_tail"][-2000:]) for r in results["targets"]]
    assert sorted(r["target"] for r in results["targets"]) == names
    for r in results["targets"]:
        assert r["executions"] > 1000, r  # it really ran, instrumented: coverage grew past the seeds
        assert r["coverage"] > 20, r
    if missing:
        needs.missing(needs.LIBZSTD, f"the {', '.join(missing)} targets did not run: no libzstd to load here")


def test_the_proof_target_names_a_prover_that_vouches_for_a_wrong_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed whose last frame is another section's: the compiled proof and the reference both name it; a
    prover that vouches for every frame is a finding."""
    from tests.fuzz import targets

    if not targets._proof.available():
        needs.missing(needs.LIBZSTD, "no libzstd: the compiled proof does not run here")
    mismatched = [s for s in run.seeds("proof") if targets._first_unproven(
        targets.Codec.ZSTD, *targets._pairs(s)) > 0]
    assert mismatched, "no seed with a wrong frame"
    targets.proof(mismatched[0])
    honest = targets._proof

    class Credulous:
        available = staticmethod(honest.available)
        ProofThread = honest.ProofThread

        @staticmethod
        def first_mismatch(news: list[bytes], originals: list[bytes]) -> int:
            return -1

    monkeypatch.setattr(targets, "_proof", Credulous)
    with pytest.raises(targets.Finding):
        targets.proof(mismatched[0])


def test_the_zstd_target_catches_a_decode_the_reference_refuses_or_reads_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled decode that answers for a truncated section, or answers other bytes, is a finding."""
    from tests.fuzz import targets

    if not targets._proof.available():
        needs.missing(needs.LIBZSTD, "no libzstd: the compiled decode does not run here")
    seed = run.seeds("zstd")[0]
    truncated = seed[:-4]
    targets.zstd(seed)
    targets.zstd(truncated)
    honest = targets._proof

    class Careless:
        available = staticmethod(honest.available)

        @staticmethod
        def decompress(data: bytes, limit: int) -> bytes | None:
            return honest.decompress(data, limit) or b"records"

    class Sloppy:
        available = staticmethod(honest.available)

        @staticmethod
        def decompress(data: bytes, limit: int) -> bytes | None:
            got = honest.decompress(data, limit)
            return got[:-1] if got else got

    monkeypatch.setattr(targets, "_proof", Careless)
    with pytest.raises(targets.Finding, match="refused"):
        targets.zstd(truncated)
    monkeypatch.setattr(targets, "_proof", Sloppy)
    with pytest.raises(targets.Finding, match="other bytes"):
        targets.zstd(seed)


def test_the_zstd_proof_targets_refuse_to_pass_where_the_compiled_proof_did_not_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose compiled code did not load says so on every input, never returns as if it had run."""
    from tests.fuzz import targets

    class Missing:
        @staticmethod
        def available() -> bool:
            return False

    monkeypatch.setattr(targets, "_proof", Missing)
    for name in targets.NEEDS_LIBZSTD:
        with pytest.raises(targets.Unavailable, match="did not load"):
            TARGETS[name](run.seeds(name)[0])
