"""Our codecs against the Java codec libraries Kafka runs on (snappy-java, lz4-java, zstd-jni, java.util.zip).

tests/java/CodecCheck.java is compiled at test time against the jars pyspark ships. It reads segments our
rewriter wrote, one per target codec, checking every batch's CRC-32C with java.util.zip.CRC32C and
decompressing its records with the Java streams Kafka opens (SnappyInputStream, LZ4FrameInputStream as
the closest stand-in for Kafka's KafkaLZ4BlockInputStream, ZstdInputStreamNoFinalizer, GZIPInputStream);
the lengths and CRC-32s of the decompressed records must be those of the original records. The other way
round, it compresses sample payloads with SnappyOutputStream, LZ4FrameOutputStream (64 KiB independent
blocks), ZstdOutputStream and GZIPOutputStream, which :func:`tiering.kafka.codecs.decompress` must read.

Skipped, with the reason, when java/javac (17+) or the jars are missing.
"""

from __future__ import annotations

import importlib.util
import io
import json
import random
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import needs
from tests.golden import by_topic, log_path
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec, compress, decompress
from tiering.kafka.reader import iter_batches
from tiering.kafka.records import Record
from tiering.kafka.rewrite import RewriteOptions, read_back, rewrite_segment
from tiering.kafka.segment import payload_of

pytestmark = [pytest.mark.java, pytest.mark.slow]

SOURCE = Path(__file__).parent.parent / "java" / "CodecCheck.java"
JAR_PATTERNS = ("snappy-java-*.jar", "lz4-java-*.jar", "zstd-jni-*.jar")
COMPRESSED = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
T0 = 1_717_000_000_000
JAVA_TIMEOUT = 120

RunJava = Callable[..., list[str]]

# How Kafka's Java producer frames a records section, as a regex over its first 16 bytes in hex.
KAFKA_FRAMING = {
    Codec.GZIP: "1f8b08.*",  # an RFC 1952 member, deflate
    Codec.SNAPPY: "82534e41505059000000000100000001",  # xerial: magic, version 1, compatible version 1
    Codec.LZ4: "04224d186040[0-9a-f]{2}.*",  # frame magic, FLG 0x60, BD 0x40 (KafkaLZ4BlockOutputStream)
    Codec.ZSTD: "28b52ffd.*",  # zstd frame magic
}


def _pyspark_jars() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def _java_major(java: str) -> int | None:
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=JAVA_TIMEOUT, check=False)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


@pytest.fixture(scope="module")
def run_java(tmp_path_factory: pytest.TempPathFactory) -> RunJava:
    """Compile CodecCheck.java once per module; returns a runner of it (stdout lines)."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        needs.missing(needs.JAVA, f"needs a JDK 17+: java={java}, javac={javac} (not on PATH)")
    major = _java_major(java)
    if major is None or major < 17:
        needs.missing(needs.JAVA, f"needs Java 17+, `java -version` reports {major}")
    jars_dir = _pyspark_jars()
    if jars_dir is None or not jars_dir.is_dir():
        needs.missing(needs.JAVA, f"pyspark's jars directory not found ({jars_dir})")
    jars: list[Path] = []
    for pattern in JAR_PATTERNS:
        found = sorted(jars_dir.glob(pattern))
        if not found:
            needs.missing(needs.JAVA, f"no {pattern} in {jars_dir}")
        jars.append(found[-1])
    classes = tmp_path_factory.mktemp("java-classes")
    native = tmp_path_factory.mktemp("java-native")  # snappy-java, lz4-java and zstd-jni unpack their .so here
    classpath = ":".join([str(classes), *map(str, jars)])
    proc = subprocess.run([javac, "--release", "17", "-cp", classpath, "-d", str(classes), str(SOURCE)],
                          capture_output=True, text=True, timeout=JAVA_TIMEOUT, check=False)
    assert proc.returncode == 0, f"javac {SOURCE.name} failed:\n{proc.stderr}"

    def run(*args: str) -> list[str]:
        proc = subprocess.run([java, f"-Djava.io.tmpdir={native}", f"-Dorg.xerial.snappy.tempdir={native}",
                               "-cp", classpath, "CodecCheck", *args],
                              capture_output=True, text=True, timeout=JAVA_TIMEOUT, check=False)
        assert proc.returncode == 0, f"CodecCheck {args[0]} failed:\n{proc.stderr}"
        return proc.stdout.splitlines()

    return run


# --- our rewrites, read by Java ------------------------------------------------------------------------


def _records(n: int, seed: int, first_offset: int, *, big: bool = False) -> list[Record]:
    rng = random.Random(seed)
    words = [b"order", b"paid", b"shipped", b"eu-west", b"customer", b"sku", b"kafka", b"tier"]
    out = []
    for i in range(n):
        value: bytes | None = b" ".join(rng.choice(words) for _ in range(5 + rng.randrange(80)))
        if i % 11 == 10:
            value = None
        key = None if i % 7 == 3 else b"k%d" % (i % 4)
        headers = ((b"trace", b"%08x" % rng.getrandbits(32)), (b"null", None)) if i % 4 == 0 else ()
        out.append(Record(first_offset + i, T0 + seed * 1000 + i, key, value, headers))
    if big:  # one ~200 KB record: several 64 KiB lz4 blocks, several 32 KiB snappy blocks, a few zstd blocks
        blob = b"".join(rng.choice(words) + b"," for _ in range(30_000)) + rng.randbytes(8192)
        out.append(Record(first_offset + n, T0 + seed * 1000 + n, b"big", blob[:200_000], ()))
    return out


def _uncompressed_segment() -> bytes:
    """Uncompressed v2 batches: their records sections ARE the original records, no decoder involved."""
    batches = []
    offset = 0
    for i, (n, big) in enumerate([(1, False), (40, False), (200, False), (30, True), (3, False), (120, False)]):
        recs = _records(n, i, offset, big=big)
        idempotent = i % 2 == 1
        spec = BatchSpec(offset, partition_leader_epoch=i, producer_id=100 + i if idempotent else -1,
                         producer_epoch=i if idempotent else -1, base_sequence=i * 10 if idempotent else -1,
                         log_append_time=T0 + 99_000 if i == 4 else None)
        batches.append(build_batch(spec, recs))
        offset = recs[-1].offset + 1
    return b"".join(batches)


def _expected(data: bytes) -> list[dict[str, Any]]:
    """Per batch, what Java must report once it has decompressed our rewrite of ``data``: the records as
    they sit in an uncompressed source; for a Kafka-written compressed batch, as our reader decompresses
    it (which test_golden holds to Kafka's own digests)."""
    out = []
    for raw in iter_batches(io.BytesIO(data)):
        h = raw.header
        records = bytes(payload_of(raw))
        out.append({"position_in_source": h.position, "base_offset": h.offset, "records_count": h.records_count,
                    "walked_records": h.records_count, "uncompressed_length": len(records),
                    "uncompressed_crc32": zlib.crc32(records), "source_codec": h.codec.label,
                    "is_control": h.is_control})
    return out


SOURCES: dict[str, Callable[[], tuple[bytes, int]]] = {
    "python-built": lambda: (_uncompressed_segment(), 0),
    # Kafka-written, every codec, ~200 KB records, LogAppendTime, control batches.
    "golden-edge": lambda: (log_path(by_topic("edge")).read_bytes(), by_topic("edge")["base_offset"]),
}


# Per (source, target codec): Java's lines, the expected values, our rewrite's codecs_after.
JavaReads = dict[tuple[str, Codec], tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]]


@pytest.fixture(scope="module")
def java_reads(run_java: RunJava, tmp_path_factory: pytest.TempPathFactory) -> JavaReads:
    """Our rewrite of every source to every compressed codec, read by Java in one run."""
    work = tmp_path_factory.mktemp("rewritten")
    files: dict[tuple[str, Codec], tuple[Path, list[dict[str, Any]], dict[str, int]]] = {}
    for name, make in SOURCES.items():
        data, base = make()
        expected = _expected(data)
        for codec in COMPRESSED:
            out = io.BytesIO()
            stats = rewrite_segment(io.BytesIO(data), out, base_offset=base,
                                    options=RewriteOptions(codec=codec, force=True)).stats
            assert read_back(io.BytesIO(out.getvalue()), base_offset=base).payload_xxh3 == stats.payload_xxh3
            path = work / f"{name}.{codec.label}.log"
            path.write_bytes(out.getvalue())
            files[name, codec] = (path, expected, dict(stats.codecs_after))
    lines = [json.loads(line) for line in run_java("read", *(str(p) for p, _, _ in files.values()))
             if line.startswith("{")]
    return {key: ([d for d in lines if d["file"] == path.name], expected, codecs_after)
            for key, (path, expected, codecs_after) in files.items()}


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
@pytest.mark.parametrize("source", list(SOURCES))
def test_java_reads_our_rewrite(java_reads: JavaReads, source: str, codec: Codec) -> None:
    java, expected, codecs_after = java_reads[source, codec]
    assert len(java) == len(expected) > 0
    seen: dict[str, int] = {}
    for j, e in zip(java, expected, strict=True):
        where = f"batch {e['base_offset']} (source byte {e['position_in_source']})"
        assert j["computed_crc"] == j["stored_crc"], f"{where}: CRC-32C per java.util.zip.CRC32C"
        assert j["base_offset"] == e["base_offset"], where
        assert j["records_count"] == e["records_count"], where
        assert j["walked_records"] == e["walked_records"], where
        assert j["uncompressed_length"] == e["uncompressed_length"], where
        assert j["uncompressed_crc32"] == e["uncompressed_crc32"], where
        if e["is_control"]:
            assert j["codec"] == "none", where
        elif source == "python-built":
            assert j["codec"] == codec.label, f"{where}: these records always shrink"
        else:
            assert j["codec"] in (codec.label, e["source_codec"]), f"{where}: recompressed, or kept as it was"

        if j["codec"] == codec.label and e["source_codec"] != codec.label:  # recompressed by us
            assert re.fullmatch(KAFKA_FRAMING[codec], j["head"]), f"{where}: framing {j['head']}"
        seen[j["codec"]] = seen.get(j["codec"], 0) + 1
    assert seen == codecs_after
    assert seen.get(codec.label, 0) > 0  # the target codec was really exercised


# --- Java compresses, we read ---------------------------------------------------------------------------


def _payloads() -> dict[str, bytes]:
    rng = random.Random(2024)
    statuses = [b"new", b"paid", b"sent"]
    text = b"".join(b'{"id": %d, "status": "%s"}\n' % (i, rng.choice(statuses)) for i in range(12_000))
    return {
        "empty": b"",  # Kafka never compresses an empty batch, but a stream may be closed without a write
        "one-byte": b"x",
        "small-json": text[:900],
        # > 64 KiB lz4 blocks, > 32 KiB snappy blocks, zstd's 128 KiB blocks; an incompressible stretch too.
        "multi-block": text[:150_000] + rng.randbytes(70_000) + text[150_000:330_000],
    }


@pytest.fixture(scope="module")
def java_compressed(run_java: RunJava, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, Codec], bytes]:
    work = tmp_path_factory.mktemp("java-compressed")
    args: list[str] = []
    for name, payload in _payloads().items():
        (work / name).write_bytes(payload)
        args += [str(work / name), str(work / f"{name}.out")]
    run_java("write", *args)
    return {(name, codec): (work / f"{name}.out.{codec.label}").read_bytes()
            for name in _payloads() for codec in COMPRESSED}


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
@pytest.mark.parametrize("payload", list(_payloads()))
def test_we_read_java_compression(java_compressed: dict[tuple[str, Codec], bytes], payload: str,
                                  codec: Codec) -> None:
    original = _payloads()[payload]
    compressed = java_compressed[payload, codec]
    assert compressed != original
    assert decompress(codec, compressed) == original
    if codec is Codec.SNAPPY:
        assert compressed.startswith(b"\x82SNAPPY\x00")  # really the xerial framing
    if codec is Codec.LZ4:
        assert compressed[:4] == b"\x04\x22\x4d\x18"
        assert compressed[4] & 0x20  # independent blocks, as asked
        assert compressed[5] == 0x40  # 64 KiB blocks
        # magic v1 takes the same frames; magic v0 would need Kafka 0.8's wrong header checksum.
        assert decompress(codec, compressed, magic=1) == original


@pytest.mark.parametrize("payload", [p for p in _payloads() if p != "empty"])
def test_our_gzip_is_byte_for_byte_javas(java_compressed: dict[tuple[str, Codec], bytes], payload: str) -> None:
    """GZIPOutputStream at Kafka's default level (Deflater's default, 6) and ours: the same bytes, header
    (XFL 0, OS 255) and trailer included, so a batch we compress to gzip is the one the broker would write."""
    assert compress(Codec.GZIP, _payloads()[payload], level=6) == java_compressed[payload, Codec.GZIP]
