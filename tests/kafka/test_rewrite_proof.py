"""The rewriter's proof and its groups: a recompressed batch that does not decode back to its records is an error
naming that batch, in file order before any later problem, and nothing of its group is written; small groups
(many hand-offs to the proof thread) give the same output as one big group and as no proof at all. Every test
runs twice for zstd: with the compiled prover (libzstd) and with the zstandard package's decoder."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

import crc32c
import pytest

from tests import needs
from tiering.demo.sample import write_segment
from tiering.errors import ConfigError, CorruptBatchError, InvalidDataError, ProofError
from tiering.kafka import _proof, reader, rewrite
from tiering.kafka.codecs import Codec, compress, decompress_all_known_size, decompress_known_size
from tiering.kafka.reader import iter_batches
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment


@pytest.fixture(autouse=True, params=["compiled prover", "zstandard package"])
def _prover(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    native = request.param == "compiled prover"
    if native and not _proof.available():
        needs.missing(needs.LIBZSTD, "no libzstd 1.5.6 or later to load here")
    monkeypatch.setattr(rewrite, "NATIVE_ZSTD_PROOF", native)


def _segment(batches: int = 24) -> bytes:
    out = io.BytesIO()
    write_segment(out, base_offset=100, kind="json", codec=Codec.SNAPPY, target_bytes=batches * 5000,
                  batch_bytes=8 * 1024, seed=3)
    return out.getvalue()


def _positions(data: bytes) -> list[tuple[int, int]]:
    return [(raw.header.position, raw.header.offset) for raw in iter_batches(io.BytesIO(data))]


def _small_groups(monkeypatch: pytest.MonkeyPatch, group_batches: int) -> None:
    """Groups of about ``group_batches`` batches: groups fill a run of batches at a time, and a run is what one
    read chunk holds, so small chunks make small runs."""
    monkeypatch.setattr(rewrite, "GROUP_BATCHES", group_batches)
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", 4096 if group_batches < 100 else 1 << 20)


def _spoil(monkeypatch: pytest.MonkeyPatch, nth: int, spoil: Callable[[bytes], bytes]) -> None:
    """Make the rewriter's compressor return ``spoil(output)`` for its ``nth`` batch (0-based)."""
    real = rewrite.compressor
    calls = [0]

    def patched(codec: Codec, level: int | None) -> Callable[[bytes | memoryview], bytes]:
        inner = real(codec, level)

        def compress(data: bytes | memoryview) -> bytes:
            out = inner(data)
            calls[0] += 1
            return spoil(out) if calls[0] - 1 == nth else out

        return compress

    monkeypatch.setattr(rewrite, "compressor", patched)


@pytest.mark.parametrize(("group_batches", "thread"), [(1, True), (5, True), (512, True), (5, False), (512, False)])
@pytest.mark.parametrize(("how", "message"), [
    (lambda b: b[:-3], "does not decode"),  # a truncated zstd frame
    (lambda b: rewrite.compressor(Codec.ZSTD, 3)(b"not the records"), "does not decode to the original records"),
])
def test_a_batch_that_fails_its_proof_is_named(monkeypatch: pytest.MonkeyPatch, group_batches: int, thread: bool,
                                               how: Callable[[bytes], bytes], message: str) -> None:
    data = _segment()
    _small_groups(monkeypatch, group_batches)
    _spoil(monkeypatch, 7, how)
    dst = io.BytesIO()
    with pytest.raises(ProofError, match=message) as e:
        rewrite_segment(io.BytesIO(data), dst, base_offset=100, path="p.log",
                        options=RewriteOptions(Codec.ZSTD, 3, proof_thread=thread))
    position, base = _positions(data)[7]
    assert (e.value.path, e.value.position, e.value.base_offset) == ("p.log", position, base)
    # Nothing from the failing batch's group on was written (groups before it may have been).
    assert len(dst.getvalue()) <= position


def test_a_proof_failure_before_a_corrupt_batch_is_the_error_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytearray(_segment())
    positions = _positions(bytes(data))
    data[positions[9][0] + 70] ^= 0xFF  # batch 9's records: a CRC mismatch
    with pytest.raises(CorruptBatchError):
        rewrite_segment(io.BytesIO(bytes(data)), io.BytesIO(), base_offset=100, options=RewriteOptions(Codec.ZSTD, 3))
    _spoil(monkeypatch, 3, lambda b: b[:-3])  # batch 3 now fails its proof, still pending when batch 9 is read
    with pytest.raises(ProofError) as e:
        rewrite_segment(io.BytesIO(bytes(data)), io.BytesIO(), base_offset=100, options=RewriteOptions(Codec.ZSTD, 3))
    assert e.value.position == positions[3][0]


def test_without_proof_the_spoilt_batch_goes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control experiment: the spoilt bytes are caught by the proof, not by anything else."""
    data = _segment()
    _spoil(monkeypatch, 7, lambda b: rewrite.compressor(Codec.ZSTD, 3)(b"not the records"))
    result = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=100,
                             options=RewriteOptions(Codec.ZSTD, 3, proof=False))
    assert result.stats.batches == len(_positions(data))


@pytest.mark.parametrize("batches", [1, 2, 3])
@pytest.mark.parametrize("thread", [True, False])
def test_a_segment_of_one_or_a_few_batches_is_proven(thread: bool, batches: int) -> None:
    """The last group is proven half on the main thread: with one batch that half is empty."""
    whole = _segment()
    data = whole[:_positions(whole)[batches][0]]  # the first batches, up to where the next one starts
    assert len(_positions(data)) == batches
    options = RewriteOptions(Codec.ZSTD, 3, proof_thread=thread)
    result = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=100, options=options)
    assert result.stats.batches == batches
    assert result.stats.batches_rewritten == batches


def test_an_empty_group_decodes_to_nothing() -> None:
    assert list(decompress_all_known_size(Codec.ZSTD, [], [])) == []
    assert rewrite._first_unproven(Codec.ZSTD, [], []) == -1


def test_a_frame_declaring_another_size_than_the_original_is_a_mismatch_not_an_allocation() -> None:
    """The one-shot decoder allocates the size a frame declares (here 2^45 bytes): the proof must not hand it
    such a frame, it decodes it within the original's size and answers that it is not the original (the fuzz
    target found it; tests/fuzz/regressions/proof/frame-declares-2-45-bytes)."""
    original = b"records " * 8
    frame = compress(Codec.ZSTD, original)
    assert frame[4] == 0  # no content size, a window descriptor: the same frame with an 8-byte size declared

    def declaring(size: int) -> bytes:
        return frame[:4] + bytes([0xC0]) + frame[5:6] + size.to_bytes(8, "little") + frame[6:]

    with pytest.raises(InvalidDataError):
        decompress_known_size(Codec.ZSTD, declaring(1 << 45), len(original))
    assert decompress_known_size(Codec.ZSTD, declaring(len(original)), len(original)) == original
    assert rewrite._first_unproven(Codec.ZSTD, [frame, declaring(1 << 45)], [original, original]) == 1
    assert rewrite._first_unproven(Codec.ZSTD, [frame, declaring(len(original))], [original, original]) == -1


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4, Codec.GZIP, Codec.NONE])
def test_groups_and_proof_do_not_change_the_output(monkeypatch: pytest.MonkeyPatch, codec: Codec) -> None:
    data = _segment(40)
    outputs = []
    for group_batches, proof, thread, buffer_bytes in [
            (512, True, True, 1 << 20), (3, True, True, 1 << 20), (1, True, True, 1 << 20), (512, True, False, 1 << 20),
            (3, True, False, 1 << 20), (512, False, True, 1 << 20),
            (512, True, True, 3000), (3, True, True, 20_000), (3, True, False, 20_000)]:  # batches straddle buffers
        _small_groups(monkeypatch, group_batches)
        monkeypatch.setattr(rewrite, "OUTPUT_BUFFER_BYTES", buffer_bytes)
        dst = io.BytesIO()
        progress: list[int] = []
        result = rewrite_segment(io.BytesIO(data), dst, base_offset=100,
                                 options=RewriteOptions(codec, proof=proof, proof_thread=thread),
                                 progress=progress.append)
        assert progress == sorted(progress)
        assert progress[-1] == len(data)
        outputs.append((dst.getvalue(), result.indexes, result.stats.to_json() | {"seconds": 0}))
    assert all(o == outputs[0] for o in outputs[1:])


@pytest.mark.parametrize("thread", [True, False])
def test_output_buffers_are_reused(monkeypatch: pytest.MonkeyPatch, thread: bool) -> None:
    """The output is laid out in a few buffers, refilled group after group once nothing refers to them."""
    _small_groups(monkeypatch, 3)
    monkeypatch.setattr(rewrite, "OUTPUT_BUFFER_BYTES", 16 * 1024)
    data = _segment(40)
    given: list[object] = []  # the buffers behind what write() was given (kept alive: distinct ids)

    class Recorder(io.BytesIO):
        def write(self, b: object) -> int:
            given.append(memoryview(b).obj)  # type: ignore[arg-type]
            return super().write(b)  # type: ignore[call-overload, no-any-return]

    dst = Recorder()
    rewrite_segment(io.BytesIO(data), dst, base_offset=100, options=RewriteOptions(Codec.ZSTD, proof_thread=thread))
    reference = io.BytesIO()
    monkeypatch.setattr(rewrite, "OUTPUT_BUFFER_BYTES", 64 << 20)
    rewrite_segment(io.BytesIO(data), reference, base_offset=100, options=RewriteOptions(Codec.ZSTD))
    assert dst.getvalue() == reference.getvalue()
    assert len(given) >= 10  # many groups written ...
    assert len({id(b) for b in given}) <= 3  # ... from the same few buffers


def test_a_destination_taking_part_of_each_write_gets_everything() -> None:
    """A raw stream may write less than it is given (its return value says how much): the rest follows."""
    data = _segment(40)

    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.got = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: object) -> int:
            taken = bytes(memoryview(b)[:1000])  # type: ignore[arg-type]
            self.got += taken
            return len(taken)

    dst, reference = Trickle(), io.BytesIO()
    rewrite_segment(io.BytesIO(data), dst, base_offset=100, options=RewriteOptions(Codec.ZSTD))
    rewrite_segment(io.BytesIO(data), reference, base_offset=100, options=RewriteOptions(Codec.ZSTD))
    assert bytes(dst.got) == reference.getvalue()


def _corrupt_records_keeping_the_crc(data: bytearray, position: int) -> None:
    """Garble a batch's compressed records and store the CRC of the result: only decoding can tell."""
    (length,) = struct.unpack_from(">i", data, position + 8)
    end = position + 12 + length
    for i in range(position + 61 + 20, min(end, position + 61 + 60)):
        data[i] ^= 0x5A
    struct.pack_into(">I", data, position + 17, crc32c.crc32c(bytes(data[position + 21 : end])))


@pytest.mark.parametrize("thread", [True, False])
def test_a_proof_failure_before_bad_records_in_the_same_run_is_the_error_reported(
        monkeypatch: pytest.MonkeyPatch, thread: bool) -> None:
    data = bytearray(_segment())
    positions = _positions(bytes(data))
    _corrupt_records_keeping_the_crc(data, positions[9][0])
    options = RewriteOptions(Codec.ZSTD, 3, proof_thread=thread)
    with pytest.raises(InvalidDataError) as plain:  # the control: batch 9 alone is reported
        rewrite_segment(io.BytesIO(bytes(data)), io.BytesIO(), base_offset=100, options=options)
    assert plain.value.position == positions[9][0]
    assert not isinstance(plain.value, ProofError)
    _spoil(monkeypatch, 3, lambda b: b[:-3])  # batch 3, in the same run (one read chunk), fails its proof
    with pytest.raises(ProofError) as e:
        rewrite_segment(io.BytesIO(bytes(data)), io.BytesIO(), base_offset=100, options=options)
    assert e.value.position == positions[3][0]


def test_an_output_past_2_gib_is_a_located_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's positions are int32: the limit (made small here) is checked before anything is indexed."""
    data = _segment()
    positions = _positions(data)
    options = RewriteOptions(Codec.NONE)  # made before the limit shrinks (the options check it too)
    monkeypatch.setattr(rewrite, "MAX_SEGMENT_BYTES", positions[5][0] + 10)
    with pytest.raises(ConfigError, match="2 GiB") as e:
        rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=100, options=options, path="big.log")
    assert e.value.path == "big.log"
    assert e.value.position is not None
    assert e.value.position <= positions[5][0]


@pytest.mark.parametrize(("codec", "threaded"), [(Codec.ZSTD, True), (Codec.GZIP, True), (Codec.LZ4, False),
                                                 (Codec.SNAPPY, False), (Codec.NONE, False)])
def test_only_slow_decoders_are_proven_on_the_second_thread(codec: Codec, threaded: bool) -> None:
    """lz4 and snappy decode a batch in microseconds: a Python proof thread's GIL hand-offs would cost more."""
    with rewrite._Output(io.BytesIO(), 0, RewriteOptions(codec), None) as out:
        assert out.threaded is threaded
    with rewrite._Output(io.BytesIO(), 0, RewriteOptions(codec, proof_thread=False), None) as out:
        assert not out.threaded
