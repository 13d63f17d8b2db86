"""The compiled zstd proof judged by Kafka's own decoder.

Each group of the fuzz target ``proof`` (its seeds, made from the zstd frames of ``tests/data``, and every
regression input) is decoded by Kafka's client code (``ZstdVerdict.java``: ``Compression.zstd()
.wrapForInput``, zstd-jni, as a broker or a Java consumer reads a batch); the first frame that Kafka does not
decode to its original must be the one ``_proof.first_mismatch`` and the Python proof name. A prover more
lenient than Kafka's decoder would vouch for batches the broker calls corrupt.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import needs
from tests.fuzz import run
from tests.fuzz.targets import _pairs
from tests.kafka_broker.broker import CLASSPATH
from tiering.kafka import _proof
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import _first_unproven

HERE = Path(__file__).parent
REGRESSIONS = Path(run.__file__).parent / "regressions" / "proof"


@pytest.fixture(autouse=True)
def _needs_the_compiled_proof() -> None:
    if not _proof.available():
        needs.missing(needs.LIBZSTD, "no libzstd 1.5.6 or later to load here")


def _kafka_decodes(frames: list[bytes], tmp_path: Path) -> list[bytes | None]:
    """What Kafka's decoder makes of each frame: the bytes, or None where it raises."""
    names = []
    for i, frame in enumerate(frames):
        (tmp_path / f"{i}.zst").write_bytes(frame)
        names.append(str(tmp_path / f"{i}.zst"))
    done = subprocess.run(["java", "-cp", CLASSPATH, str(HERE / "ZstdVerdict.java"), *names],
                          capture_output=True, text=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == len(frames), done.stderr[-2000:]
    return [bytes.fromhex(line[3:]) if line.startswith("ok ") else None for line in lines]


def _first_refused(news: list[bytes], originals: list[bytes], decoded: dict[bytes, bytes | None]) -> int:
    return next((i for i, (n, o) in enumerate(zip(news, originals, strict=True)) if decoded[n] != o), -1)


@pytest.mark.kafka  # Kafka's own decoder, run with java from its jars
def test_the_compiled_proof_names_the_frame_kafka_refuses(tmp_path: Path) -> None:
    groups = {p.name: _pairs(p.read_bytes()) for p in sorted(REGRESSIONS.iterdir())}
    groups |= {f"seed {i}": _pairs(s) for i, s in enumerate(run.seeds("proof"))}
    frames = sorted({n for news, _ in groups.values() for n in news})
    decoded = dict(zip(frames, _kafka_decodes(frames, tmp_path), strict=True))

    verdicts = {name: (_first_refused(news, originals, decoded), _proof.first_mismatch(news, originals),
                       _first_unproven(Codec.ZSTD, news, originals))
                for name, (news, originals) in groups.items()}
    differ = {name: v for name, v in verdicts.items() if len(set(v)) > 1}
    assert not differ, f"(Kafka, compiled, Python) first frame refused: {differ}"

    # The inputs hold both answers: frames Kafka refuses (the old libzstd's finding among them) and groups
    # it reads whole.
    assert verdicts["frame-an-old-libzstd-accepts"][0] == 0
    assert any(v[0] == -1 for v in verdicts.values())
    assert sum(v[0] >= 0 for v in verdicts.values()) >= 3


def test_the_decoder_loaded_is_at_least_kafka_s() -> None:
    library = _proof.library()
    assert library is not None
    version = tuple(int(x) for x in library.split()[-1].split("."))
    assert version >= (1, 5, 6), library  # zstd-jni 1.5.6, tools/kafka/pom.xml's Kafka


@pytest.mark.kafka
def test_the_compiled_decode_answers_only_what_kafka_reads_the_same(tmp_path: Path) -> None:
    """Each input of the fuzz target ``zstd`` (Kafka's zstd records sections from tests/data, frames of other
    shapes, the regressions): where ``_proof.decompress`` answers bytes, Kafka's decoder reads the same bytes;
    where Kafka refuses the section, the compiled decode answers nothing (the Python path then names it)."""
    inputs = {f"seed {i}": s for i, s in enumerate(run.seeds("zstd"))}
    inputs |= {p.name: p.read_bytes() for p in sorted((REGRESSIONS.parent / "zstd").iterdir())}
    names = sorted(inputs)
    kafka = dict(zip(names, _kafka_decodes([inputs[n][2:] for n in names], tmp_path), strict=True))
    compiled = {n: _proof.decompress(inputs[n][2:], 1 << 30) for n in names}
    differ = [n for n in names if compiled[n] is not None and compiled[n] != kafka[n]]
    assert not differ, differ
    assert kafka["rle-block-past-128k"] is None
    assert kafka["rle-block-past-its-window"] is None
    assert sum(c is not None for c in compiled.values()) >= 100  # most seeds are decoded here, as Kafka does
