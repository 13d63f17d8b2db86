"""One declarative mechanism for documents (issue 49): the run document of 10,000 listed segments read and
written today's way and as declared models, with pydantic v2 and with msgspec.

    .venv/bin/python bench/bench_documents.py                           # 10,000 segments, best of 5
    .venv/bin/python bench/bench_documents.py --segments 2000 --repeat 3 --json bench/out/documents.json
    .venv/bin/python bench/bench_documents.py --document /tmp/run-10k.json   # also keep the document

The document is today's: a compaction's :class:`tiering.run.documents.RunResult` (schema version 3) folded
by :class:`~tiering.run.documents.RunTally` from ``--segments`` synthetic :class:`SegmentResult` of 100
partitions' worth of topics (``synthetic_results``: compacted with the rewrite's stats and the source's
facts, some re-batched; skipped for no savings, at planning for age, budget, policy or as already compacted;
failed, with the error; left pending, busy or transient; merges and rollbacks a crashed run left, recovered),
every one listed, and S3 requests by partition in its usage; written as ``put_json`` writes it (indented,
sorted keys). The one change: each segment's ``stats`` carries a ``kind`` (``rewrite``, ``source``,
``merge``), the tag of the typed union the models declare; today's reader passes it through.

Each way is measured on that document's bytes (best of ``--repeat``):

* **baseline**: ``json.loads`` and :meth:`RunResult.from_json` (decode), ``json.dumps`` of
  :meth:`RunResult.to_json` (encode; compact, as the libraries write, and also as ``put_json`` writes);
* **pydantic**: ``bench/documents_pydantic.py``, frozen ``BaseModel`` with ``extra="forbid"`` and
  ``strict=True``, read by ``model_validate_json``, written by ``TypeAdapter.dump_json(exclude_none=True)``;
* **msgspec**: ``bench/documents_msgspec.py``, frozen ``Struct`` with ``forbid_unknown_fields`` and a tagged
  union, a ``msgspec.json.Decoder`` and ``Encoder`` (measured only where msgspec can be imported).

Per way, in a fresh child process each time: the library's import (``-X importtime``: the cumulative
microseconds of every top-level import its statement makes), the declaration's (importing its documents
module once the library is in), and a decode's peak memory: the Python allocations' (tracemalloc, above what
was traced before it, the decoded document included) and the resident size's (VmHWM over VmRSS before it;
pydantic-core's own Rust allocations are only in this one). Then every way reads bad documents: an unknown
field and a wrong type (a number as a string) in the middle segment (``segments[5000]`` for 10,000), and a
document of another schema version and of another kind; what each says is printed and kept.

Every way must read the document to the same content: each one's encoding of what it decoded, read back as
JSON, equals the document once fields left out for being null (or, in a segment, their default) are.

Prints a table and writes ``--json``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import os
import platform
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from tiering.commit.operation import SegmentResult
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status, StorageClass
from tiering.run.documents import RUN_SCOPE, RunResult, RunTally

BENCH: Final = Path(__file__).resolve().parent
REPO: Final = BENCH.parent
WAYS: Final = ("baseline", "pydantic", "msgspec")
MODULES: Final = {"pydantic": "documents_pydantic", "msgspec": "documents_msgspec"}
IMPORTS: Final = {"baseline": "import json",
                  "pydantic": "from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError",
                  "msgspec": "import msgspec, msgspec.json"}
PER_PARTITION: Final = 100
TOPICS: Final = ("orders", "payments", "clicks", "audit", "inventory", "sessions", "metrics", "billing")
SEGMENT_DEFAULTS: Final = {"reason": "", "bytes_before": 0, "bytes_after": 0, "recovered": False}
RUN_ID: Final = "20261207T210000Z-b49d0c"
WHERE: Final = f"s3://segments/logs/_tiering/runs/{RUN_ID}/compact.json"


def _hex(rng: random.Random, n: int = 32) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def _log(rng: random.Random, size: int) -> dict[str, Any]:
    return {"size": size, "storage_class": rng.choice((StorageClass.STANDARD, StorageClass.STANDARD_IA)),
            "last_modified": f"2026-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                             f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}+00:00"}


def _rewrite(rng: random.Random, directory: str, base: int, size: int, out: int) -> dict[str, Any]:
    """A rewrite's stats as :meth:`tiering.kafka.rewrite.RewriteResult.to_json` writes them."""
    batches = rng.randint(200, 4000)
    kept = rng.randint(0, batches // 20)
    stats: dict[str, Any] = {
        "kind": "rewrite", "path": f"s3://segments/logs/{directory}/{base:020d}.log", "base_offset": base,
        "codec": "zstd", "level": 3, "bytes_in": size, "bytes_out": out, "ratio": round(out / size, 6),
        "saved_bytes": size - out, "batches": batches, "records": batches * rng.randint(10, 500),
        "batches_rewritten": batches - kept, "batches_kept": {"small": kept} if kept else {},
        "codecs_before": {"snappy": batches - kept, "none": kept} if kept else {"snappy": batches},
        "codecs_after": {"zstd": batches - kept, "none": kept} if kept else {"zstd": batches},
        "uncompressed_bytes": size * rng.randint(3, 6), "payload_xxh3": _hex(rng),
        "seconds": round(rng.uniform(0.5, 9.0), 3), "log": _log(rng, size)}
    if rng.random() < 0.1:  # re-batched first: the rebatch stats and the source's own digest
        stats["source_payload_xxh3"] = _hex(rng)
        stats["rebatch"] = {"batches_in": batches * 4, "batches_out": batches, "runs_merged": batches // 2,
                            "batches_merged": batches * 3, "records": stats["records"], "bytes_in": size,
                            "merged_bytes": {"in": size // 2, "recompressed_alone": out, "out": out * 9 // 10},
                            "recompressed_alone_measured": {"batches": 64, "of": batches * 3, "estimate": True},
                            "saved_by_rebatching": out // 10, "undecided": 0, "refusals": {},
                            "records_sha256": _hex(rng, 64),
                            "batches_sha256": {"in": _hex(rng, 64), "out": _hex(rng, 64)},
                            "batches_digest_changed": True}
    return stats


def _error(rng: random.Random, name: str, message: str, path: str, *, retryable: bool) -> dict[str, Any]:
    """An error as :meth:`tiering.errors.TieringError.to_dict` writes it (an S3 error's with its code)."""
    doc: dict[str, Any] = {"error": name, "message": message, "path": path, "position": None,
                           "base_offset": None, "expected": None, "found": None, "retryable": retryable}
    if name == "S3Error":
        doc |= {"code": "SlowDown", "status": 503, "request_id": _hex(rng, 16).upper()}
    return doc


def synthetic_results(segments: int, seed: int = 49) -> list[SegmentResult]:
    """``segments`` results of a compaction, the mix a large run sees (see the module's doc)."""
    rng = random.Random(seed)
    out = []
    for i in range(segments):
        partition = i // PER_PARTITION
        directory = f"{TOPICS[partition % len(TOPICS)]}-{partition // len(TOPICS)}"
        base = (i % PER_PARTITION) * 1_048_576 + rng.randint(0, 1000)
        size = rng.randint(200 << 20, 1 << 30)
        out_size = int(size * rng.uniform(0.25, 0.7))
        key = f"s3://segments/logs/{directory}/{base:020d}.log"
        seconds = round(rng.uniform(0.5, 12.0), 3)
        roll = rng.random()
        if roll < 0.70:
            stats = {**_rewrite(rng, directory, base, size, out_size), "verified": "checksum"}
            r = SegmentResult(directory, base, Status.COMPACTED, "", size, out_size, stats=stats, run_id=RUN_ID,
                              seconds=seconds)
        elif roll < 0.76:
            cause = rng.choice((Cause.NO_SAVINGS, Cause.BELOW_MIN_SAVINGS))
            r = SegmentResult(directory, base, Status.SKIPPED, f"{cause}: zstd saves 0.4%", size, size,
                              stats=_rewrite(rng, directory, base, size, size - 1000), cause=cause, seconds=seconds)
        elif roll < 0.85:
            cause = rng.choice((Cause.TOO_YOUNG, Cause.ALREADY_COMPACTED, Cause.BUDGET, Cause.POLICY, Cause.ACTIVE))
            r = SegmentResult(directory, base, Status.SKIPPED, f"{cause.label}", size, size,
                              stats={"kind": "source", "log": _log(rng, size)}, cause=cause)
        elif roll < 0.88:
            cause = rng.choice((Cause.INVALID, Cause.UNREADABLE, Cause.PROOF_FAILED, Cause.REFUSED))
            r = SegmentResult(directory, base, Status.FAILED, f"not run: {cause}", error=_error(
                rng, "InvalidDataError", f"{cause}: batch CRC mismatch", key, retryable=False), cause=cause,
                seconds=seconds)
        elif roll < 0.92:
            pending = rng.choice((Pending.BUSY, Pending.TRANSIENT))
            cause = Cause.BUSY if pending is Pending.BUSY else Cause.TRANSIENT
            error = (_error(rng, "S3Error", "Please reduce your request rate.", key, retryable=True)
                     if pending is Pending.TRANSIENT else None)
            r = SegmentResult(directory, base, Status.SKIPPED, f"partition busy: {cause}", error=error,
                              pending=pending, cause=cause)
        elif roll < 0.97:
            first = i % 3 == 0
            merge = {"segments_before": 3, "segments_after": 1, "storage_class": StorageClass.STANDARD,
                     "objects_before": [rng.randint(1 << 20, 1 << 28) for _ in range(9)],
                     "objects_after": [rng.randint(1 << 28, 1 << 30) for _ in range(3)]}
            r = SegmentResult(directory, base, Status.MERGED, "finished a crashed run's operation",
                              size if first else 0, out_size if first else 0, recovered=True,
                              stats={"kind": "merge", **({"merge": merge} if first else {}),
                                     "log": _log(rng, size)}, run_id="20261206T020000Z-0a1b2c")
        else:
            r = SegmentResult(directory, base, Status.ROLLED_BACK, "restored from run 20261201T010000Z-fe0123's "
                              "backup", size, size, recovered=True, run_id="20261205T030000Z-c0ffee")
        out.append(r)
    return out


def run_document(segments: int) -> RunResult:
    """A compaction's run document listing ``segments`` segments, its usage by partition."""
    tally = RunTally(max_listed=segments)
    results = synthetic_results(segments)
    for r in results:
        tally.add(r)
    for p in range(0, segments, PER_PARTITION):
        directory = results[p].directory
        tally.add_usage({directory: {"GetObject": 3 * PER_PARTITION, "PutObject": 5 * PER_PARTITION,
                                     "CopyObject": 2 * PER_PARTITION, "DeleteObject": 4 * PER_PARTITION,
                                     "UploadPart": 40 * PER_PARTITION}},
                        sum(r.seconds or 0.0 for r in results[p:p + PER_PARTITION]))
    tally.add_usage({RUN_SCOPE: {"ListObjectsV2": 1 + segments // 250, "PutObject": 12, "GetObject": 30}})
    settings = {"codec": "zstd", "level": 3, "estimate": None, "max_segments": None, "max_bytes": None,
                "plan_created_at": "2026-12-07T20:55:00+00:00"}
    return tally.result(RunKind.COMPACT, RUN_ID, "segments", "logs", "2026-12-07T21:00:00+00:00",
                        "2026-12-07T23:10:00+00:00", settings, tally.usage())


def put_json_bytes(doc: object) -> bytes:
    """A document's bytes as :func:`tiering.storage.objects.put_json` writes them."""
    return json.dumps(doc, indent=1, sort_keys=True).encode()


class Way:
    """How one way reads and writes the run document: ``decode`` from bytes to its typed object, ``encode``
    back to compact bytes, ``read`` as the reader would (its errors naming the document)."""

    def __init__(self, name: str, version: str, decode: Callable[[bytes], Any], encode: Callable[[Any], bytes],
                 read: Callable[[bytes, str], Any]) -> None:
        self.name, self.version = name, version
        self.decode, self.encode, self.read = decode, encode, read


def _baseline_decode(data: bytes) -> RunResult:
    return RunResult.from_json(json.loads(data), WHERE)


def _baseline_encode(run: RunResult) -> bytes:
    return json.dumps(run.to_json()).encode()


def _baseline_read(data: bytes, where: str) -> RunResult:
    return RunResult.from_json(json.loads(data), where)


def _library(name: str) -> ModuleType | None:
    """The documents module of way ``name`` (beside this file), or None where its library cannot be imported."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as e:
        if e.name == MODULES[name]:  # this directory's module itself, not the library
            raise
        return None


def way(name: str) -> Way | None:
    if name == "baseline":
        return Way(name, platform.python_version(), _baseline_decode, _baseline_encode, _baseline_read)
    module = _library(name)
    if module is None:
        return None
    return Way(name, str(module.VERSION), module.decode, module.encode, module.read)


def best_ms(work: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``work``, in milliseconds (garbage collected before each)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def comparable(doc: Any, defaults: Mapping[str, object] | None = None) -> Any:
    """``doc`` with every null field left out, and in each segment the fields equal to their default: what a
    way may leave out when it writes."""
    if isinstance(doc, dict):
        return {k: comparable(v, SEGMENT_DEFAULTS if k == "segments" else None) for k, v in doc.items()
                if v is not None and not (defaults is not None and k in defaults and v == defaults[k])}
    if isinstance(doc, list):
        return [comparable(v, defaults) for v in doc]
    return doc


def bad_documents(doc: dict[str, Any]) -> dict[str, bytes]:
    """The document broken four ways: an unknown field and a wrong type in its middle segment, another
    schema version, another kind."""
    middle = len(doc["segments"]) // 2
    unknown, wrong_type, version, kind = (copy.deepcopy(doc) for _ in range(4))
    unknown["segments"][middle]["colour"] = "blue"
    wrong_type["segments"][middle]["base_offset"] = str(doc["segments"][middle]["base_offset"])
    version["schema_version"] = 4
    kind["kind"] = "tiering.step-results"
    return {"unknown field": put_json_bytes(unknown), "wrong type": put_json_bytes(wrong_type),
            "wrong version": put_json_bytes(version), "wrong kind": put_json_bytes(kind)}


def what_it_says(read: Callable[[bytes], object], data: bytes) -> str:
    """What ``read`` says of ``data``: its error's type and text, or that it read it."""
    try:
        read(data)
    except Exception as e:  # what any error says is the measure
        return f"{type(e).__name__}: {e}"
    return "(read without an error)"


def errors_of(w: Way, bad: Mapping[str, bytes]) -> dict[str, dict[str, str]]:
    """Per bad document, what ``w``'s reader says (its kind and version checked first) and what its decode
    alone says (the library's own message)."""
    return {case: {"read": what_it_says(lambda d: w.read(d, WHERE), data), "decode": what_it_says(w.decode, data)}
            for case, data in bad.items()}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def child(name: str, document: Path) -> dict[str, float]:
    """In a fresh process: the declaration's time (its module imported once the library is), a decode's
    peak resident size over the size before it, and its traced Python allocations' peak."""
    for module in ("tiering.errors", "tiering.lifecycle.vocabulary"):  # what the declarations import
        importlib.import_module(module)

    declare_ms = 0.0
    if name != "baseline":
        exec(IMPORTS[name], {})  # the library first: only the declaration is timed
        started = time.perf_counter()
        importlib.import_module(MODULES[name])
        declare_ms = (time.perf_counter() - started) * 1000
    w = way(name)
    assert w is not None
    data = document.read_bytes()
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts afresh
    decoded = w.decode(data)
    rss_rise = _status_kib("VmHWM") - before
    del decoded
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    w.decode(data)  # its peak holds the decoded document, whether kept or not
    traced = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return {"declare_ms": declare_ms, "rss_rise_kib": rss_rise, "traced_peak_kib": traced / 1024}


def _env() -> dict[str, str]:
    """The children's environment: this process's module path (the repository, this directory, and where a
    library was found, such as a ``pip install --target`` folder) ahead of theirs."""
    paths = [p for p in sys.path if p and Path(p).is_dir() and "site-packages" not in p
             and not p.startswith(sys.base_prefix)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH), *paths])}


def import_ms(name: str) -> float:
    """The library's import statement in a fresh process: the cumulative time of every top-level import it
    makes (``-X importtime``; the interpreter's own start-up imports, before the marker, left out)."""
    code = f"import sys; sys.stderr.write('-- mark\\n'); {IMPORTS[name]}"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True, env=_env())
    lines = done.stderr.split("-- mark\n", 1)[1].splitlines()
    total = 0
    for line in lines:
        if line.startswith("import time:") and "|" in line:
            _, cumulative, module = line.split("|")
            if not module[1:].startswith(" "):  # a top-level import (nested ones are indented)
                total += int(cumulative)
    return total / 1000


def measure(w: Way, data: bytes, document: Path, repeat: int) -> dict[str, Any]:
    decoded = w.decode(data)
    row: dict[str, Any] = {"way": w.name, "version": w.version,
                           "decode_ms": best_ms(lambda: w.decode(data), repeat),
                           "read_ms": best_ms(lambda: w.read(data, WHERE), repeat),
                           "encode_ms": best_ms(lambda: w.encode(decoded), repeat),
                           "encoded_bytes": len(w.encode(decoded))}
    if w.name == "baseline":
        row["encode_put_json_ms"] = best_ms(lambda: put_json_bytes(decoded.to_json()), repeat)
    children = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, __file__, "--child", w.name, "--document", str(document)],
                              capture_output=True, text=True, check=False, env=_env())
        if done.returncode != 0:
            raise RuntimeError(f"the {w.name} child failed (exit {done.returncode}): {done.stderr[-2000:]}")
        children.append(json.loads(done.stdout.strip().splitlines()[-1]))
    row["declare_ms"] = min(c["declare_ms"] for c in children)
    row["rss_rise_mib"] = min(c["rss_rise_kib"] for c in children) / 1024
    row["traced_peak_mib"] = min(c["traced_peak_kib"] for c in children) / 1024
    row["import_ms"] = min(import_ms(w.name) for _ in range(repeat))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'way':<9} {'version':>8} {'decode ms':>9} {'read ms':>7} {'encode ms':>9} {'out KiB':>8} "
            f"{'peak MiB':>8} {'RSS+ MiB':>8} {'import ms':>9} {'declare ms':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['way']:<9} {r['version']:>8} {r['decode_ms']:>9.1f} {r['read_ms']:>7.1f} "
                     f"{r['encode_ms']:>9.1f} {r['encoded_bytes'] / 1024:>8.0f} {r['traced_peak_mib']:>8.1f} "
                     f"{r['rss_rise_mib']:>8.1f} {r['import_ms']:>9.1f} {_declare(r):>10}")
    return "\n".join(lines)


def _declare(row: dict[str, Any]) -> str:
    """The declaration's time (none for the baseline: its classes are the package's own)."""
    return "-" if row["way"] == "baseline" else f"{row['declare_ms']:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", type=int, default=10_000, help="segments the run document lists "
                   "(default %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="runs of each measure, the best kept (default %(default)s)")
    p.add_argument("--json", type=Path, default=Path("bench/out/bench_documents.json"),
                   help="where the results go (default %(default)s)")
    p.add_argument("--document", type=Path, help="keep the run document measured here (default: a temporary file)")
    p.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.document)))
        return 0

    run = run_document(args.segments)
    original = run.to_json()
    data = put_json_bytes(original)
    document = args.document or args.json.with_suffix(".document.json")
    document.parent.mkdir(parents=True, exist_ok=True)
    document.write_bytes(data)
    print(f"run document: {args.segments:,} segments listed, {len(data) / 1024:,.0f} KiB as put_json writes it "
          f"({document})", file=sys.stderr)
    ways = {name: way(name) for name in WAYS}
    absent = [name for name, w in ways.items() if w is None]
    for name in absent:
        print(f"{name}: not installed (pip install {name}); measured without it", file=sys.stderr)
    present = [w for w in ways.values() if w is not None]

    expected = comparable(json.loads(data))
    for w in present:  # every way reads the document to the same content
        if comparable(json.loads(w.encode(w.decode(data)))) != expected:
            raise RuntimeError(f"{w.name} does not read the run document back to its content")
    rows = []
    for w in present:
        rows.append(measure(w, data, document, args.repeat))
        print(f"  {w.name} measured", file=sys.stderr, flush=True)
    bad = bad_documents(original)
    errors = {w.name: errors_of(w, bad) for w in present}

    print(table(rows))
    baseline = next((r for r in rows if r["way"] == "baseline"), None)
    if baseline is not None:
        print(f"baseline encode as put_json writes it (indent=1, sort_keys): {baseline['encode_put_json_ms']:.1f} ms")
    for name, said in errors.items():
        print(f"\n{name} on bad documents:")
        for case, texts in said.items():
            print(f"  {case}: {_trimmed(texts['read'])}")
            if texts["decode"] != texts["read"] and name != "baseline":
                print(f"  {' ' * len(case)}  (decode alone: {_trimmed(texts['decode'])})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"segments": args.segments, "document_bytes": len(data), "repeat": args.repeat,
                                     "rows": rows, "errors": errors, "absent": absent,
                                     "python": platform.python_version(), "cpus": os.cpu_count(),
                                     "commit": _commit()}, indent=1) + "\n")
    return 0


def _trimmed(text: str, most: int = 400) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False, cwd=REPO)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
