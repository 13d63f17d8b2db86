"""Capture the JSON documents the code of its commit writes, by running that code end to end.

    python -m tests.data.documents.make_corpus [--out DIR]

What it captures is what the code of the commit it is run at writes: every kind of run, started the way the
command line, the DAGs' steps and the tests start them, on one in-process moto bucket; every document those
runs write under ``PREFIX/_tiering/``, byte for byte as the client sent it (a hook on the S3 clients'
successful PutObject calls, so that the documents that live only while a run works, journal entries and
leases, are caught too); the plan file ``tiering s3 scan --out`` writes to disk; the S3 Inventory manifest the
demo's inventory writer puts. Each goes to ``<kind>/<name>`` under ``--out`` (default: this directory).

DO NOT rerun it after a change to a document's format. The corpus is the past that today's readers must keep
reading (``tests/test_documents_corpus.py``); rerunning it would replace that past with the present, and the
test would prove nothing. It refuses to write where a corpus is already. To add documents a later commit
writes, run it at that commit with ``--out`` a scratch directory, copy the new files in under new names, and
say in the README which commit wrote them.

Nothing is hand-built but the two Airflow XCom values read back by a later task (a plan step's, a tier
step's): Airflow serializes those itself, so they are ``json.dumps`` of the dict the task returns.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moto import mock_aws

BUCKET = "segments"
PREFIX = "prod/kafka"
ROOT = f"{PREFIX}/_tiering/"
HERE = Path(__file__).resolve().parent
INVENTORY_AT = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)  # the inventory's creation time (names its directory)

# The policies the runs follow (their paths, relative to the work directory, are what documents record).
COMPACT_POLICY = """\
version: 1
cluster:
  compression.type: zstd
  compression.level: 3
topics:
  - topic: audit.v1
    compression.type: auto
    auto.candidates: [zstd:3, lz4]
"""
TIER_POLICY = """\
version: 1
topics:
  - topic: archive.v1
    storage.tiers:
      - {after.days: 30, storage.class: STANDARD_IA}
"""


def _bytes_for_moto(request: Any, **_: Any) -> None:
    """moto's in-process stub takes a body as bytes, not the bytearray a streamed upload sends its parts as (what
    ``tests/conftest.py`` does for the tests)."""
    if isinstance(request.body, bytearray):
        request.body = bytes(request.body)


@dataclass
class Capture:
    """Every document a client wrote under the reserved prefix (or an inventory's manifest), in order, as
    (phase, key, body): the body exactly as sent, kept only once S3 accepted the write."""

    phase: str = ""
    writes: list[tuple[str, str, bytes]] = field(default_factory=list)

    def hook(self, client: Any) -> None:
        events = client.meta.events
        events.register_first("before-send", _bytes_for_moto)
        events.register("before-parameter-build.s3.PutObject", self._before)
        events.register("after-call.s3.PutObject", self._after)

    @staticmethod
    def _wanted(key: str) -> bool:
        if key.startswith(ROOT):
            rest = key[len(ROOT):]
            return not rest.startswith(("staging/", "backup/")) and rest != "clock"
        return key.endswith("/manifest.json")  # an S3 Inventory report's

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        key, body = str(params.get("Key", "")), params.get("Body")
        if isinstance(body, bytes | bytearray) and self._wanted(key):
            context["corpus-capture"] = (key, bytes(body))

    def _after(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        got = context.pop("corpus-capture", None)
        if got is not None and http_response.status_code < 300:
            self.writes.append((self.phase, *got))

    def of(self, phase: str) -> list[tuple[str, bytes]]:
        return [(key, body) for p, key, body in self.writes if p == phase]


@contextlib.contextmanager
def environment(workdir: Path) -> Iterator[None]:
    """Credentials moto accepts, no endpoint (moto in process), the work directory as the current one."""
    saved = dict(os.environ)
    cwd = Path.cwd()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_PROFILE", "TIERING_PRICE_REGION",
                 "TIERING_PRICES_FILE", "TIERING_ACCOUNT_STANDARD_TB", "TIERING_POLICY_FILE"):
        os.environ.pop(name, None)
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


# What the runs wrote that adds nothing to the corpus: the same kind and shape as a document kept from
# another run (the dry run's scan, the second compaction's plan and work, the cleanup's other units).
DROPPED = ("plan-manifest/dry-1-scan.json", "plan-chunk/dry-1-scan-*", "step-usage/dry-1-*",
           "plan-manifest/compact-2-plan.json", "plan-chunk/compact-2-*", "step-usage/compact-2-*",
           "compact-work/compact-2-*", "step-results/compact-2-*", "journal/compact-2-*",
           "step-results/cleanup-1-cleanup-unit-0000[1-9].json")


class Corpus:
    """The corpus directory, written one document at a time (each file at most once; none of :data:`DROPPED`)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.files: list[Path] = []

    def put(self, kind: str, name: str, body: bytes) -> None:
        if any(fnmatch.fnmatchcase(f"{kind}/{name}", pattern) for pattern in DROPPED):
            return
        path = self.out / kind / name
        if path in self.files:
            raise ValueError(f"{path} written twice")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        self.files.append(path)


def _cli(*argv: str) -> dict[str, Any]:
    """``tiering ARGV --json`` in this process; its one JSON document (a failure stops the capture)."""
    from tiering.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--json"], stdout=out, stderr=err)
    if code != 0:
        raise SystemExit(f"tiering {' '.join(argv)} exited {code}:\n{err.getvalue()}")
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def _run_documents(corpus: Corpus, run_id: str, writes: list[tuple[str, bytes]]) -> None:
    """What run ``run_id`` wrote under ``runs/<run>/`` and ``reports/<run>/``, each by its kind."""
    runs, reports = f"{ROOT}runs/{run_id}/", f"{ROOT}reports/{run_id}/"
    seen: dict[str, bytes] = {}
    for key, body in writes:
        if key.startswith((runs, reports)):
            seen[key] = body  # the last version of each
    for key, body in seen.items():
        if key.startswith(reports):
            name = key[len(reports):]
            if name == "report.json":
                corpus.put("report", f"{run_id}.json", body)
            elif name == "tiering.json":
                corpus.put("tier-report", f"{run_id}.json", body)
            continue
        parts = key[len(runs):].split("/")
        if len(parts) == 1:
            if parts[0] == "tier-plan.json":
                corpus.put("tier-plan", f"{run_id}.json", body)
            else:
                corpus.put("run", f"{run_id}.json", body)
        elif parts[0] in ("scan", "policy", "plan"):
            if parts[1] == "manifest.json":
                corpus.put("plan-manifest", f"{run_id}-{parts[0]}.json", body)
            else:
                corpus.put("plan-chunk", f"{run_id}-{parts[0]}-{parts[1]}", body)
        elif parts[0].endswith("-plan"):
            corpus.put(f"{parts[0].removesuffix('-plan')}-work", f"{run_id}-{parts[1]}", body)
        elif parts[0] == "usage":
            corpus.put("step-usage", f"{run_id}-{parts[1]}", body)
        else:
            corpus.put("step-results", f"{run_id}-{parts[0]}-{parts[1]}", body)


def _states(corpus: Corpus, phase: str, writes: list[tuple[str, bytes]]) -> None:
    """The last state document of each partition the phase wrote one for."""
    last: dict[str, bytes] = {}
    for key, body in writes:
        if key.startswith(f"{ROOT}state/"):
            last[key.rsplit("/", 1)[1]] = body
    for name, body in last.items():
        corpus.put("partition-state", f"{phase}-{name}", body)


def _journals(corpus: Corpus, phase: str, writes: list[tuple[str, bytes]]) -> None:
    """The first journal entry of each operation kind and state the phase wrote (the states of one operation
    as it went)."""
    taken: set[tuple[str, str]] = set()
    for key, body in writes:
        if key.startswith(f"{ROOT}journal/"):
            doc = json.loads(body)
            shape = (str(doc["kind"]), str(doc["state"]))
            if shape not in taken:
                taken.add(shape)
                corpus.put("journal", f"{phase}-{shape[0]}-{shape[1]}.json", body)


def _leases(corpus: Corpus, phase: str, writes: list[tuple[str, bytes]]) -> None:
    """A partition's lease as acquired, and as last renewed."""
    bodies = [body for key, body in writes if key.startswith(f"{ROOT}leases/")]
    if bodies:
        corpus.put("lease", f"{phase}-acquired.json", bodies[0])
        renewed = [b for b in bodies if json.loads(b)["renewals"] > 0]
        if renewed:
            corpus.put("lease", f"{phase}-renewed.json", renewed[-1])


def capture(out: Path) -> list[Path]:
    """Run every kind of run on a fresh in-process bucket and write what they wrote into ``out``."""
    from tests.kafka.test_keycompact import NOW
    from tests.s3 import test_keycompact_s3 as keys
    from tests.s3.conftest import seed
    from tiering.commit.operation import Context
    from tiering.demo.inventory import write_inventory
    from tiering.run.cleanup import CleanupOptions, cleanup
    from tiering.run.pipeline import RunSettings
    from tiering.run.rollback import rollback
    from tiering.steps import compaction as dag
    from tiering.steps import storage_classes as tiers
    from tiering.storage import s3

    corpus = Corpus(out)
    recorder = Capture()
    make_client: Callable[..., Any] = s3.make_client

    def capturing(**kwargs: Any) -> Any:
        client = make_client(**kwargs)
        recorder.hook(client)
        return client

    def log(_line: str) -> None:
        pass

    with tempfile.TemporaryDirectory() as tmp, environment(Path(tmp)), mock_aws():
        s3.make_client = capturing  # every client the runs make: the command line's, their threads'
        try:
            client = s3.make_client()
            client.create_bucket(Bucket=BUCKET)
            store = s3.S3Store(client, BUCKET)
            seed(store)  # orders.v1-0: three segments, two sealed
            seed(store, topic="events.v1")
            seed(store, topic="audit.v1")  # its policy's automatic codec choice declines it
            seed(store, topic="metrics.v1", segments=4, segment_bytes=20_000)
            seed(store, topic="archive.v1", segments=3, segment_bytes=300_000)  # .log objects over 128 KiB
            keys.upload(store, keys.partition(aborts=True))  # profiles.compacted-0
            Path("compact-policy.yaml").write_text(COMPACT_POLICY)
            Path("tier-policy.yaml").write_text(TIER_POLICY)
            where = ("--bucket", BUCKET, "--prefix", PREFIX)

            # The whole plan a scan writes to disk, with a dry run's forecast (`tiering s3 scan --out`).
            recorder.phase = "scan"
            _cli("s3", "scan", *where, "--topics", r"orders\.v1", "--min-age-minutes", "0", "--estimate",
                 "--out", "plan.json")
            corpus.put("plan", "scan-estimate.json", Path("plan.json").read_bytes())

            # The compaction DAG's dry run: scan, plan with the forecast, the run document and report.
            recorder.phase = "dry-1"
            params = dag.CompactionParams(RunSettings(BUCKET, PREFIX, "dry-1", "zstd"), r"orders\.v1", 0, None,
                                          None, True, 7.0, None, None, None, False)
            dag.scan(store, params, log)
            planned = dag.plan(store, params, log)
            corpus.put("plan-step", "dry-1.json", json.dumps(planned.to_json()).encode())
            dag.report(store, params, log)

            # A compaction by a policy choosing the codec (`tiering s3 compact`: scan, policy, plan, run,
            # report), then one of another topic without a report (the ledger counts it from the states).
            recorder.phase = "compact-1"
            _cli("s3", "compact", *where, "--topics", r"(orders|audit)\.v1", "--min-age-minutes", "0",
                 "--policy", "compact-policy.yaml", "--codec", "zstd", "--max-segments", "1",
                 "--run-id", "compact-1")
            recorder.phase = "compact-quiet"
            _cli("s3", "compact", *where, "--topics", r"events\.v1", "--min-age-minutes", "0", "--codec", "zstd",
                 "--level", "3", "--run-id", "compact-quiet", "--no-report")

            recorder.phase = "keys-1"
            _cli("s3", "compact-keys", *where, "--topics", r"profiles\..*", "--min-age-minutes", "0",
                 "--now-ms", str(NOW), "--run-id", "keys-1")

            recorder.phase = "merge-1"
            _cli("s3", "merge", *where, "--topics", r"metrics\.v1", "--min-age-minutes", "0",
                 "--segment-bytes", "1MiB", "--run-id", "merge-1")

            # The tiering DAG's steps: the run and its tier-plan, then the report.
            recorder.phase = "tier-1"
            run = tiers.TieringParams(BUCKET, PREFIX, "tier-1", "tier-policy.yaml", False)
            step, _ = tiers.tier(store, run, log)
            corpus.put("tier-step", "tier-1.json", json.dumps(step.to_json()).encode())
            tiers.report(store, run, tiers.TierStep.from_json(step.to_json()), log)

            # What compact-1's budget left: its scan finds both compactions' generations in the partitions'
            # states, and compact-quiet (no report of its own) enters the ledger counted from them.
            recorder.phase = "compact-2"
            _cli("s3", "compact", *where, "--topics", r"(orders|events)\.v1", "--min-age-minutes", "0",
                 "--codec", "zstd", "--run-id", "compact-2")

            for phase, target in (("undo-compact", "compact-1"), ("undo-merge", "merge-1"),
                                  ("undo-tier", "tier-1")):
                recorder.phase = phase
                rollback(store, Context(store, PREFIX, phase), target)

            recorder.phase = "cleanup-1"
            cleanup(store, Context(store, PREFIX, "cleanup-1"), CleanupOptions(grace_days=0.0))

            recorder.phase = "inventory"
            write_inventory(store, BUCKET, "inventory/daily", list(store.list(f"{PREFIX}/")),
                            created_at=INVENTORY_AT)
        finally:
            s3.make_client = make_client

    for phase in ("dry-1", "compact-1", "keys-1", "merge-1", "tier-1", "compact-2", "undo-compact", "undo-merge",
                  "undo-tier", "cleanup-1"):
        writes = recorder.of(phase)
        _run_documents(corpus, phase, writes)
        _states(corpus, phase, writes)
        _journals(corpus, phase, writes)
    for phase in ("compact-1", "merge-1"):
        _leases(corpus, phase, recorder.of(phase))
    ledger = [body for _, key, body in recorder.writes if key == f"{ROOT}reports/ledger.json"]
    corpus.put("ledger", "first.json", ledger[0])
    corpus.put("ledger", "last.json", ledger[-1])
    (inventory,) = [body for key, body in recorder.of("inventory") if key.endswith("/manifest.json")]
    corpus.put("s3-inventory-manifest", "daily.json", inventory)
    return corpus.files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.data.documents.make_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=HERE,
                   help="where to write the corpus, one directory per kind (default: %(default)s); refused where "
                        "any kind's directory exists already")
    args = p.parse_args(argv)
    out: Path = args.out
    there = sorted(d.name for d in out.iterdir() if d.is_dir() and d.name != "__pycache__") if out.exists() else []
    if there:
        print(f"{out} holds a corpus already ({', '.join(there)}): it is the past the readers must keep reading, "
              "not to be replaced (see the module docstring)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        files = capture(out)
    except BaseException:
        for kind in {f.relative_to(out).parts[0] for f in out.rglob("*.json*")}:
            shutil.rmtree(out / kind, ignore_errors=True)
        raise
    for path in files:
        print(f"{path.stat().st_size:>7} {path.relative_to(out)}")
    print(f"{len(files)} documents in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
