"""The compiled zstd proof (_proof.c) against the zstandard package's decoder as the reference: the same verdict
for every group, on the calling thread and on its own thread, whatever the frames hold; and its thread's
bookkeeping (order, close, buffers held while in use)."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import needs
from tiering.errors import DecompressionError
from tiering.kafka import _proof, rewrite
from tiering.kafka.codecs import Codec, decompress, zstd_reference


@pytest.fixture(autouse=True)
def _needs_the_compiled_proof() -> None:
    if not _proof.available():
        needs.missing(needs.LIBZSTD, "no libzstd 1.5.6 or later to load here")


_COMPRESS = zstandard.ZstdCompressor(level=3)


def _reference(news: list[bytes], originals: list[bytes]) -> int:
    """The first batch the zstandard package does not decode to its original (decode error, length, bytes);
    a batch's bytes may hold several frames, as Kafka's readers accept."""
    decoder = zstandard.ZstdDecompressor()
    for i, (new, original) in enumerate(zip(news, originals, strict=True)):
        back, rest = b"", new
        try:
            while rest:
                frame = decoder.decompressobj()
                back += frame.decompress(rest)
                if not frame.eof:
                    raise zstandard.ZstdError("truncated frame")
                rest = frame.unused_data
        except zstandard.ZstdError:
            return i
        if back != original:
            return i
    return -1


def _group(n: int = 40) -> tuple[list[bytes], list[bytes]]:
    originals = [(b'{"user": %d, "page": "/item/%d"}' % (i, i * 7)) * (1 + i % 50) for i in range(n)]
    return [_COMPRESS.compress(o) for o in originals], originals


def test_the_library_is_named_with_its_version() -> None:
    name = _proof.library()
    assert name is not None
    file, version = name.rsplit(" ", 1)
    assert "zstandard" in file or "libzstd" in file  # the zstandard package's CFFI backend, or the system's libzstd
    assert version.count(".") == 2


def test_a_good_group_passes_on_both_paths() -> None:
    news, originals = _group()
    assert _proof.first_mismatch(news, originals) == -1
    prover = _proof.ProofThread()
    prover.submit(news, originals)
    assert prover.result() == -1
    prover.close()


@pytest.mark.parametrize(("spoil", "why"), [
    (lambda new, original: new[:-3], "truncated frame"),
    (lambda new, original: b"\x00" * len(new), "not zstd at all"),
    (lambda new, original: _COMPRESS.compress(original + b"!"), "decodes to one byte more"),
    (lambda new, original: _COMPRESS.compress(original[:-1]), "decodes to one byte less"),
    (lambda new, original: _COMPRESS.compress(original[:5] + b"X" + original[6:]), "one byte differs"),
    (lambda new, original: new + new, "two frames: the records twice"),
    (lambda new, original: b"", "empty"),
])
def test_the_first_spoilt_batch_is_named(spoil: object, why: str) -> None:
    news, originals = _group()
    for at in (0, 17, len(news) - 1):
        spoilt = list(news)
        spoilt[at] = spoil(news[at], originals[at])  # type: ignore[operator]
        spoilt[at + 1 if at + 1 < len(news) else 0] = b"also bad, but later or earlier"
        expected = _reference(spoilt, originals)
        assert expected in (0, at), why
        assert _proof.first_mismatch(spoilt, originals) == expected, why
        prover = _proof.ProofThread()
        prover.submit(spoilt, originals)
        assert prover.result() == expected, why
        prover.close()


def test_concatenated_frames_and_frames_without_content_size_decode_like_kafka_reads_them() -> None:
    original = b"abc" * 5000
    no_size = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(original)
    two = _COMPRESS.compress(original[:7000]) + _COMPRESS.compress(original[7000:])
    assert _proof.first_mismatch([no_size, two, _COMPRESS.compress(b"")], [original, original, b""]) == -1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=3000), st.integers(0, 3), st.integers(0, 10_000)),
                min_size=1, max_size=12))
def test_verdicts_equal_the_zstandard_packages(batches: list[tuple[bytes, int, int]]) -> None:
    originals, news = [], []
    for records, how, where in batches:
        new = _COMPRESS.compress(records)
        if how == 1 and records:  # a different byte in the records
            i = where % len(records)
            new = _COMPRESS.compress(records[:i] + bytes([records[i] ^ 0xFF]) + records[i + 1:])
        elif how == 2 and new:  # a flipped byte in the frame
            i = where % len(new)
            new = new[:i] + bytes([new[i] ^ 0x5A]) + new[i + 1:]
        originals.append(records)
        news.append(new)
    expected = _reference(news, originals)
    assert _proof.first_mismatch(news, originals) == expected
    prover = _proof.ProofThread()
    prover.submit(news, originals)
    assert prover.result() == expected


def test_the_thread_answers_groups_in_the_order_they_were_submitted() -> None:
    news, originals = _group(30)
    prover = _proof.ProofThread()
    expected = []
    for k in range(25):
        spoilt = list(news)
        if k % 3:
            spoilt[k] = news[(k + 1) % len(news)]  # another batch's frame: decodes, but to other records
        prover.submit(spoilt, originals)
        expected.append(k if k % 3 else -1)
    assert [prover.result() for _ in expected] == expected
    with pytest.raises(RuntimeError, match="no group was submitted"):
        prover.result()
    prover.close()


def test_buffers_stay_held_until_the_verdict_is_collected() -> None:
    news, originals = _group(5)
    records = bytearray(originals[0])
    prover = _proof.ProofThread()
    prover.submit(news[:1], [records])
    with pytest.raises(BufferError):  # the prover holds a view: the memory can not move under it
        records.extend(b"more")
    assert prover.result() == -1
    records.extend(b"more")  # released
    prover.close()


def test_closing_or_dropping_a_thread_with_groups_pending_is_safe() -> None:
    news, originals = _group(200)
    prover = _proof.ProofThread()
    for _ in range(20):
        prover.submit(news, originals)
    prover.close()
    with pytest.raises(RuntimeError, match="closed"):
        prover.submit(news, originals)
    dropped = _proof.ProofThread()
    for _ in range(20):
        dropped.submit(news, originals)
    del dropped  # joins its thread, releases the buffers


@pytest.mark.parametrize(("payload", "expected"), [
    (lambda o: _COMPRESS.compress(o) * 2, 0),  # the records twice
    (lambda o: _COMPRESS.compress(o) + b"junk", 0),  # bytes after the frame
    (lambda o: _COMPRESS.compress(o[:1000]) + _COMPRESS.compress(o[1000:]), -1),  # two frames, the records once
    (lambda o: struct.pack("<II", 0x184D2A50, 3) + b"abc" + _COMPRESS.compress(o), -1),  # a skippable frame first
])
def test_the_fallback_proof_reads_every_frame_as_the_compiled_one(payload: object, expected: int) -> None:
    original = b'{"k": "v"}' * 300
    news = [payload(original)]  # type: ignore[operator]
    assert _proof.first_mismatch(news, [original]) == expected
    assert rewrite._first_unproven(Codec.ZSTD, news, [original]) == expected  # the zstandard package's path


def test_no_frame_at_all_is_never_a_proof_even_of_no_records() -> None:
    assert _proof.first_mismatch([_COMPRESS.compress(b""), b""], [b"", b""]) == 1  # as the codec's readers say


def test_a_second_caller_gets_an_error_not_a_crash() -> None:
    """submit() reads the sequences with Python code: a call made from there (as another thread could make
    one while a method waits without the GIL) is refused; the group in hand is not disturbed."""
    news, originals = _group(3)
    prover = _proof.ProofThread()
    errors: list[str] = []

    class Reentrant(list[bytes]):
        def __getitem__(self, i: object) -> bytes:  # type: ignore[override]
            for call in (prover.result, prover.close, lambda: prover.submit(news, originals)):
                try:
                    call()
                except RuntimeError as e:
                    errors.append(str(e))
            return list.__getitem__(self, i)  # type: ignore[call-overload, no-any-return]

    prover.submit(Reentrant(news), originals)
    assert errors == ["a ProofThread is used by one thread at a time"] * 3 * len(news)
    assert prover.result() == -1
    prover.close()
    prover.close()  # closing twice is fine


def test_a_forked_child_can_close_but_not_use_its_copy() -> None:
    news, originals = _group(40)
    prover = _proof.ProofThread()
    prover.submit(news, originals)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        code = 1
        try:
            prover.result()
        except RuntimeError as e:
            code = 0 if "forked child" in str(e) else 2
        prover.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert prover.result() == -1  # the parent's groups are untouched
    prover.close()


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        _proof.first_mismatch([b"x"], [])
    with pytest.raises(TypeError):
        _proof.first_mismatch([1], [b"x"])
    prover = _proof.ProofThread()
    with pytest.raises(TypeError):
        prover.submit([b"x"], ["not a buffer"])
    prover.close()
    with pytest.raises(TypeError, match="no arguments"):
        _proof.ProofThread(threads=2)  # type: ignore[call-arg]


def test_without_the_library_the_module_says_so() -> None:
    code = ("from tiering.kafka import _proof, rewrite\n"
            "assert not _proof.available() and _proof.library() is None and not rewrite.NATIVE_ZSTD_PROOF\n"
            "try:\n    _proof.ProofThread()\nexcept RuntimeError as e:\n    print(e)\n")
    env = {**os.environ, "TIERING_NO_NATIVE_ZSTD": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "no libzstd (1.5.6 or later) was found" in out


@pytest.mark.parametrize(("descriptor", "accepted"), [(0x88, True), (0x89, False), (0xAF, False)])
def test_a_frame_declaring_a_window_a_stream_refuses_is_a_mismatch(descriptor: int, accepted: bool) -> None:
    """A frame's window descriptor (RFC 8878, 3.1.1.1.2) is checked as a streaming decoder checks it, Kafka's
    and the zstandard package's: at most 2^27 bytes (0x88: exponent 17, 2^(10+17)); 0x89 adds an eighth."""
    original = b"records section " * 8
    frame = bytearray(zstandard.ZstdCompressor(level=3, write_content_size=False).compress(original))
    assert frame[4] & 0x20 == 0  # not single-segment: a window descriptor follows the frame header's first byte
    frame[5] = descriptor
    stream_reads = True
    try:
        back = zstandard.ZstdDecompressor().decompress(bytes(frame), max_output_size=len(original))
        stream_reads = back == original
    except zstandard.ZstdError:
        stream_reads = False
    assert stream_reads is accepted
    assert _proof.first_mismatch([bytes(frame)], [original]) == (-1 if accepted else 0)
    assert rewrite._first_unproven(Codec.ZSTD, [bytes(frame)], [original]) == (-1 if accepted else 0)


def _streamed(data: bytes, checksum: bool = False) -> bytes:
    """A frame as Kafka's writer makes it: streamed, so without a declared content size."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3, write_checksum=checksum).stream_writer(out, closefd=False) as w:
        w.write(data)
    return out.getvalue()


SECTION = b"".join(b"key-%d:value-%d;" % (i, i * i) for i in range(5000))


@pytest.mark.parametrize("frames", [
    pytest.param(_COMPRESS.compress, id="declared size"),
    pytest.param(_streamed, id="streamed"),
    pytest.param(lambda s: _streamed(s, checksum=True), id="content checksum"),
    pytest.param(lambda s: _COMPRESS.compress(s[:1000]) + _streamed(s[1000:]), id="two frames"),
])
def test_the_compiled_decode_answers_the_references_bytes(frames: Callable[[bytes], bytes]) -> None:
    data = frames(SECTION)
    assert _proof.decompress(data, 1 << 30) == zstd_reference(data, 1 << 30) == SECTION
    assert decompress(Codec.ZSTD, data) == SECTION


@pytest.mark.parametrize(("data", "why"), [
    (_COMPRESS.compress(SECTION)[:-5], "truncated"),
    (b"\x50\x2a\x4d\x18\x00\x00\x00\x00" + _COMPRESS.compress(SECTION), "a skippable frame first"),
    (_COMPRESS.compress(b""), "no content"),
    (bytes([*_COMPRESS.compress(SECTION)[:4], _COMPRESS.compress(SECTION)[4] | 0x08])
     + _COMPRESS.compress(SECTION)[5:], "the reserved bit"),
    (b"not zstd at all", "no magic"),
])
def test_what_the_compiled_decode_does_not_answer_the_reference_decides(data: bytes, why: str) -> None:
    assert _proof.decompress(data, 1 << 30) is None, why
    assert _outcome(lambda: decompress(Codec.ZSTD, data)) == _outcome(lambda: zstd_reference(data, 1 << 30))


def _outcome(call: Callable[[], bytes]) -> bytes | str:
    """The bytes decoded, or the error's message."""
    try:
        return call()
    except DecompressionError as e:
        return f"error: {e}"


def test_a_section_whose_bound_is_past_the_limit_is_the_references_to_judge() -> None:
    data = _COMPRESS.compress(SECTION)
    assert _proof.decompress(data, len(SECTION) - 1) is None
    with pytest.raises(DecompressionError, match="decompression limit"):
        decompress(Codec.ZSTD, data, limit=len(SECTION) - 1)
    assert _proof.decompress(data, len(SECTION)) == SECTION


def test_the_compiled_decode_is_safe_from_two_threads() -> None:
    data = [_streamed(SECTION[i:]) for i in range(0, 4000, 100)]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda d: _proof.decompress(d, 1 << 30), data))
            assert got == [SECTION[i:] for i in range(0, 4000, 100)]


@pytest.mark.parametrize(("descriptor", "size"), [(0x02, 2000), (0x88, (128 << 10) + 1)])
def test_a_block_past_the_block_maximum_is_refused_as_a_stream_refuses_it(descriptor: int, size: int) -> None:
    """An RLE block may regenerate at most min(window, 128 KiB) bytes (RFC 8878, 3.1.1.2.4): libzstd's one-shot
    decoder takes more, a streaming decoder (Kafka's, the zstandard package's) refuses it. (0x02: a window of
    1,280 bytes; 0x88: 128 MiB, so 128 KiB is the limit.)"""
    header = (size << 3) | (1 << 1) | 1  # the last block, RLE
    frame = bytes([0x28, 0xB5, 0x2F, 0xFD, 0x00, descriptor]) + header.to_bytes(3, "little") + b"A"
    original = b"A" * size
    with pytest.raises(zstandard.ZstdError):
        zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    assert _proof.first_mismatch([frame], [original]) == 0
    assert rewrite._first_unproven(Codec.ZSTD, [frame], [original]) == 0
    assert _proof.decompress(frame, 1 << 30) is None
    with pytest.raises(DecompressionError):
        decompress(Codec.ZSTD, frame)


def _small_window(frame: bytes) -> bytes:
    """``frame`` (not single-segment) declaring a 1 KiB window."""
    assert frame[4] & 0x20 == 0
    return frame[:5] + b"\x00" + frame[6:]


def test_a_frame_whose_output_outgrows_its_window_is_left_to_the_reference() -> None:
    """Past its window a stream decodes through a ring buffer: a block decoding to more than the window, or a
    match reaching back past it, is an error or bytes that depend on what the buffer held before. The compiled
    decode answers only for frames whose output fits their window."""
    big_block = _small_window(_streamed(b"abc" * 350))  # one block of 1,050 bytes in a 1 KiB window
    with pytest.raises(DecompressionError):
        zstd_reference(big_block, 1 << 30)
    assert _proof.decompress(big_block, 1 << 30) is None

    chunks = [os.urandom(1000) for _ in range(3)]
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=20)
    encoder = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = b"".join(encoder.compress(c) + encoder.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                     for c in [*chunks, chunks[0]]) + encoder.flush()
    assert _proof.decompress(frame, 1 << 30) == b"".join([*chunks, chunks[0]])
    assert _proof.decompress(_small_window(frame), 1 << 30) is None  # the last block repeats the first, 3 KB back

    fits = _streamed(b"abc" * 300)  # 900 bytes: within a 1 KiB window
    assert _proof.decompress(_small_window(fits), 1 << 30) == zstd_reference(_small_window(fits), 1 << 30)
