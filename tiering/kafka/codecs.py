"""Compression codecs, written and read the way Kafka's Java client does.

| id | codec  | what Kafka's Java client writes                                            |
|----|--------|----------------------------------------------------------------------------|
| 0  | none   | the records as they are                                                    |
| 1  | gzip   | one RFC 1952 gzip member (java.util.zip.GZIPOutputStream); we read several |
| 2  | snappy | xerial snappy-java framing: 8-byte magic, int32 version, int32 compatible   |
|    |        | version, then blocks of int32 length + raw snappy (32 KiB of input each);  |
|    |        | some non-Java clients write raw snappy, which we also read                 |
| 3  | lz4    | one LZ4 frame: FLG 0x60 (version 1, independent blocks, no checksums, no   |
|    |        | content size), BD 0x40 (64 KiB blocks); for magic v0 the header checksum   |
|    |        | is computed over the magic too (KAFKA-3160), we reproduce and accept it    |
| 4  | zstd   | zstd frames from a streaming encoder: no content size in the header; we    |
|    |        | read concatenated frames                                                   |

Every decompression is bounded by ``limit`` bytes of output: a bomb, or a payload whose headers lie,
ends in :class:`DecompressionError` long before memory runs out.
"""

from __future__ import annotations

import functools
import struct
import threading
import zlib
from array import array
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Final, cast

import lz4.frame
import snappy
import xxhash
import zstandard

from tiering.errors import ConfigError, DecompressionError
from tiering.kafka import _proof

DEFAULT_DECOMPRESSION_LIMIT: Final = 256 * 1024 * 1024
"""Largest decompressed records section accepted per batch, in bytes (configurable per call)."""


class Codec(IntEnum):
    """Compression codec ids of the attributes' bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> Codec:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            known = ", ".join(c.label for c in cls)
            raise ConfigError(f"unknown codec {name!r}", expected=known, found=name) from None


CODEC_MASK: Final = 0x07
CODECS: Final = tuple(Codec)
"""Codecs by id: ``CODECS[attributes & CODEC_MASK]`` is much cheaper per batch than ``Codec(id)``."""

# Levels as Kafka's producer config accepts them (compression.<codec>.level), and its defaults.
LEVEL_RANGE: Final[dict[Codec, tuple[int, int]]] = {
    Codec.GZIP: (1, 9),
    Codec.LZ4: (1, 17),
    Codec.ZSTD: (-131072, 22),
}
DEFAULT_LEVEL: Final[dict[Codec, int]] = {Codec.GZIP: 6, Codec.LZ4: 9, Codec.ZSTD: 3}


def check_level(codec: Codec, level: int | None) -> int | None:
    """Return the effective level for ``codec`` (its Kafka default when ``level`` is None)."""
    if codec not in LEVEL_RANGE:
        if level is not None:
            raise ConfigError(f"codec {codec.label} takes no level", expected="no --level", found=level)
        return None
    if level is None:
        return DEFAULT_LEVEL[codec]
    low, high = LEVEL_RANGE[codec]
    if not low <= level <= high:
        raise ConfigError(f"{codec.label} level out of range", expected=f"{low}..{high}", found=level)
    return level


# --- gzip -------------------------------------------------------------------------------------

_GZIP_WBITS: Final = 31  # zlib: gzip container, 32 KiB window
_DEFLATE_WBITS: Final = -15  # zlib: a raw deflate stream, 32 KiB window
# The member header java.util.zip.GZIPOutputStream writes (Java 16 and later; a broker runs on 17+): no flags,
# no time, XFL 0 whatever the level, OS 255 ("unknown"). zlib's own would say OS 3 (Unix) and set XFL by
# level; with this one a batch we compress is byte for byte the broker's (the deflate stream is zlib's in both).
_JAVA_GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def _gzip_compress(data: bytes | memoryview, level: int) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, _DEFLATE_WBITS)
    trailer = zlib.crc32(data).to_bytes(4, "little") + (len(data) & 0xFFFFFFFF).to_bytes(4, "little")
    return _JAVA_GZIP_HEADER + c.compress(data) + c.flush() + trailer


_GZIP_FEED_FIRST: Final = 256
_GZIP_FEED_MAX: Final = 1 << 20


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    """Member after member. Input is fed in growing slices, so what zlib hands back after a member's end
    (``unused_data``, a copy) stays small: linear time even for thousands of tiny members."""
    view = memoryview(data)
    out: list[bytes] = []
    total = pos = members = 0
    while pos < len(view):
        d = zlib.decompressobj(_GZIP_WBITS)
        feed = _GZIP_FEED_FIRST
        while not d.eof:
            if pos >= len(view):
                raise DecompressionError(f"gzip member {members} is truncated", expected="end of stream",
                                         found="end of data")
            piece = view[pos : pos + feed]
            pos += len(piece)
            feed = min(feed * 2, _GZIP_FEED_MAX)
            try:
                chunk = d.decompress(piece, limit - total + 1)
            except zlib.error as e:
                raise DecompressionError(f"gzip member {members}: {e}") from e
            total += len(chunk)
            if total > limit or d.unconsumed_tail:
                raise DecompressionError("gzip output exceeds the decompression limit",
                                         expected=f"<= {limit} bytes", found="more")
            out.append(chunk)
        pos -= len(d.unused_data)  # those bytes start the next member
        members += 1
    if members == 0:
        raise DecompressionError("empty gzip payload", expected="a gzip member", found="0 bytes")
    return out[0] if len(out) == 1 else b"".join(out)


# --- snappy -----------------------------------------------------------------------------------

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = struct.Struct(">8sii")  # magic, version, min compatible version
XERIAL_VERSION: Final = 1
XERIAL_BLOCK_SIZE: Final = 32 * 1024  # snappy-java's default block size for SnappyOutputStream
_INT32: Final = struct.Struct(">i")


def _snappy_raw_length(block: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint)."""
    result = shift = 0
    for i in range(min(5, len(block))):
        b = block[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result
        shift += 7
    raise DecompressionError("snappy block has a malformed length prefix")


def _snappy_raw(block: bytes | memoryview, done: int, limit: int) -> bytes:
    """One raw snappy block, refused before decoding when ``done`` bytes plus its declared length pass ``limit``."""
    declared = _snappy_raw_length(block)
    if done + declared > limit:
        raise DecompressionError("snappy output exceeds the decompression limit", expected=f"<= {limit} bytes",
                                 found=f"{done + declared} bytes declared")
    try:
        out = bytes(snappy.uncompress(block))
    except Exception as e:  # python-snappy raises an empty UncompressError; its cause has the detail
        raise DecompressionError(f"snappy: {e.__cause__ or e or type(e).__name__}") from e
    if len(out) != declared:
        raise DecompressionError("snappy block length differs from its prefix", expected=declared, found=len(out))
    return out


def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != XERIAL_MAGIC:
        return _snappy_raw(view, 0, limit)
    if len(view) < _XERIAL_HEADER.size:
        raise DecompressionError("xerial snappy header is truncated", expected=f"{_XERIAL_HEADER.size} bytes",
                                 found=len(view))
    out: list[bytes] = []
    total = 0
    pos = _XERIAL_HEADER.size
    while pos < len(view):
        if pos + 4 > len(view):
            raise DecompressionError(f"xerial snappy block length is truncated (at compressed byte {pos})")
        (n,) = _INT32.unpack_from(view, pos)
        pos += 4
        if n < 0 or pos + n > len(view):
            raise DecompressionError("xerial snappy block overruns the payload", expected=f"<= {len(view) - pos}",
                                     found=n)
        chunk = _snappy_raw(view[pos : pos + n], total, limit)
        total += len(chunk)
        out.append(chunk)
        pos += n
    return out[0] if len(out) == 1 else b"".join(out)


def _snappy_compress(data: bytes | memoryview) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION)]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(snappy.compress(view[start : start + XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# --- lz4 --------------------------------------------------------------------------------------

LZ4_FRAME_MAGIC: Final = b"\x04\x22\x4d\x18"
_LZ4_FLG_CONTENT_SIZE: Final = 0x08
_LZ4_FLG_DICT_ID: Final = 0x01


def _lz4_header_checksum_position(data: bytes | memoryview) -> int:
    if len(data) < 7 or bytes(data[:4]) != LZ4_FRAME_MAGIC:
        raise DecompressionError("not an LZ4 frame", expected=LZ4_FRAME_MAGIC.hex(), found=bytes(data[:4]).hex())
    flg = data[4]
    return 6 + (8 if flg & _LZ4_FLG_CONTENT_SIZE else 0) + (4 if flg & _LZ4_FLG_DICT_ID else 0)


_LZ4_FLG_BLOCK_CHECKSUM: Final = 0x10
_LZ4_FLG_CONTENT_CHECKSUM: Final = 0x04
_LZ4_BLOCK_MAX: Final = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # BD bits 4-6
_UINT32_LE: Final = struct.Struct("<I")
_LZ4_UNCOMPRESSED_BIT: Final = 0x80000000


def _lz4_bound(data: bytes | memoryview) -> int:
    """Walk an LZ4 frame's block headers: an upper bound of its output, and a clear error if it is cut short.

    | bytes   | field                                                            |
    |---------|------------------------------------------------------------------|
    | 4       | magic 0x184D2204                                                 |
    | 1, 1    | FLG (content size 0x08, block checksum 0x10, content checksum 0x04), BD (block max size) |
    | 0/8, 0/4 | content size, dictionary id                                     |
    | 1       | header checksum                                                  |
    | blocks  | uint32 LE size (high bit: stored uncompressed), data, [checksum 4] |
    | 4       | end mark 0, then [content checksum 4]                            |
    """
    pos = _lz4_header_checksum_position(data) + 1
    flg, bd = data[4], data[5]
    block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 0x07)
    if block_max is None:
        raise DecompressionError("lz4 frame has an invalid block size descriptor", expected="4..7",
                                 found=(bd >> 4) & 0x07)
    extra = 4 if flg & _LZ4_FLG_BLOCK_CHECKSUM else 0
    bound = 0
    while True:
        if pos + 4 > len(data):
            raise DecompressionError("lz4 frame is truncated", expected="a block header or the end mark",
                                     found=f"{len(data) - pos} bytes")
        (word,) = _UINT32_LE.unpack_from(data, pos)
        pos += 4
        if word == 0:
            break
        size = word & ~_LZ4_UNCOMPRESSED_BIT
        bound += size if word & _LZ4_UNCOMPRESSED_BIT else block_max
        pos += size + extra
    pos += 4 if flg & _LZ4_FLG_CONTENT_CHECKSUM else 0
    if pos != len(data):
        raise DecompressionError("lz4 frame length differs from the payload", expected=f"{pos} bytes",
                                 found=f"{len(data)} bytes")
    return bound


def _lz4_checksum(descriptor: bytes) -> int:
    return (xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF


def _lz4_decompress(data: bytes | memoryview, limit: int, magic: int) -> bytes:
    if magic == 0:
        # Kafka 0.8/0.9 computed the header checksum over the magic too (KAFKA-3160): put the right one
        # back so that the frame decoder accepts it, as Kafka does when it reads v0.
        hc = _lz4_header_checksum_position(data)
        if hc < len(data):
            fixed = bytearray(data)
            fixed[hc] = _lz4_checksum(bytes(fixed[4:hc]))
            data = bytes(fixed)
    bound = _lz4_bound(data)
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        # The binding allocates max_length up front: only pass the limit when the frame could exceed it.
        out = d.decompress(data) if bound <= limit else d.decompress(data, max_length=limit + 1)
    except RuntimeError as e:
        raise DecompressionError(f"lz4: {e}") from e
    if len(out) > limit or (d.needs_input is False and not d.eof):
        raise DecompressionError("lz4 output exceeds the decompression limit", expected=f"<= {limit} bytes",
                                 found="more")
    if not d.eof:
        raise DecompressionError("lz4 frame is truncated", expected="end mark", found="end of data")
    if d.unused_data:
        raise DecompressionError("bytes after the lz4 frame", expected="0", found=len(d.unused_data))
    return bytes(out)


def _lz4_compress(data: bytes | memoryview, level: int, magic: int) -> bytes:
    # Kafka uses lz4-java's fast compressor at its default level 9 and the HC compressor otherwise.
    frame_level = 0 if level == DEFAULT_LEVEL[Codec.LZ4] else min(level, lz4.frame.COMPRESSIONLEVEL_MAX)
    out: bytes = lz4.frame.compress(
        data,
        compression_level=frame_level,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    )
    if magic == 0:
        hc = _lz4_header_checksum_position(out)
        broken = bytearray(out)
        broken[hc] = _lz4_checksum(bytes(broken[:hc]))
        out = bytes(broken)
    return out


# --- zstd -------------------------------------------------------------------------------------

_local = threading.local()
_ZSTD_READ_CHUNK: Final = 1 << 20


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "zstd_c", None)
    if cache is None:
        cache = _local.zstd_c = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=False, write_checksum=False)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "zstd_d", None)
    if d is None:
        d = _local.zstd_d = zstandard.ZstdDecompressor()
    return d


ZSTD_MAGIC: Final = 0xFD2FB528
MAX_ZSTD_FRAMES: Final = 4096  # Kafka's writer makes one frame per batch; this bounds the work on junk
_ZSTD_SKIPPABLE_MASK: Final = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC: Final = 0x184D2A50
_ZSTD_BLOCK_MAX: Final = 128 << 10
_ZSTD_DID_SIZE: Final = (0, 1, 2, 4)
_ZSTD_FCS_SIZE: Final = (0, 2, 4, 8)  # by Frame_Content_Size_flag; flag 0 with Single_Segment means 1 byte


def _zstd_frames(data: bytes | memoryview) -> list[tuple[int, int, int]]:
    """(start, end, output bound) of every frame (skippable frames left out): RFC 8878's frame walk.

    | bytes      | field                                                              |
    |------------|--------------------------------------------------------------------|
    | 4          | magic 0xFD2FB528 (LE)                                              |
    | 1          | Frame_Header_Descriptor: FCS flag bits 7-6, Single_Segment bit 5,  |
    |            | reserved bit 3, Content_Checksum bit 2, Dictionary_ID flag bits 1-0 |
    | 0/1        | Window_Descriptor (absent with Single_Segment)                     |
    | 0/1/2/4    | Dictionary_ID                                                      |
    | 0/1/2/4/8  | Frame_Content_Size (LE; the 2-byte form adds 256)                  |
    | blocks     | 3-byte LE header: Last_Block bit 0, Block_Type bits 1-2 (raw, RLE, |
    |            | compressed, reserved), Block_Size bits 3-23; then its content      |
    | 0/4        | Content_Checksum                                                   |
    """
    view = memoryview(data)
    frames: list[tuple[int, int, int]] = []
    pos = 0
    while pos < len(view):
        if len(frames) >= MAX_ZSTD_FRAMES:
            raise DecompressionError("too many zstd frames in one payload", expected=f"<= {MAX_ZSTD_FRAMES}",
                                     found="more")
        start = pos
        if pos + 4 > len(view):
            raise DecompressionError(f"zstd frame magic is truncated (at compressed byte {pos})")
        (magic,) = _UINT32_LE.unpack_from(view, pos)
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            if pos + 8 > len(view):
                raise DecompressionError(f"zstd skippable frame is truncated (at compressed byte {pos})")
            pos += 8 + _UINT32_LE.unpack_from(view, pos + 4)[0]
            if pos > len(view):
                raise DecompressionError(f"zstd skippable frame is truncated (at compressed byte {start})")
            continue
        if magic != ZSTD_MAGIC:
            raise DecompressionError(f"not a zstd frame (at compressed byte {pos})", expected=f"magic {ZSTD_MAGIC:#x}",
                                     found=f"{magic:#x}")
        if pos + 5 > len(view):
            raise DecompressionError(f"zstd frame header is truncated (at compressed byte {pos})")
        fhd = view[pos + 4]
        if fhd & 0x08:
            raise DecompressionError(f"zstd frame header has its reserved bit set (at compressed byte {pos})")
        single_segment = bool(fhd & 0x20)
        fcs_size = _ZSTD_FCS_SIZE[fhd >> 6] or (1 if single_segment else 0)
        fcs_at = pos + 5 + (0 if single_segment else 1) + _ZSTD_DID_SIZE[fhd & 0x03]
        pos = fcs_at + fcs_size
        if pos > len(view):
            raise DecompressionError(f"zstd frame header is truncated (at compressed byte {start})")
        content_size = None
        if fcs_size:
            content_size = int.from_bytes(view[fcs_at:pos], "little") + (256 if fcs_size == 2 else 0)
        bound = 0
        while True:
            if pos + 3 > len(view):
                raise DecompressionError(f"zstd frame is truncated (at compressed byte {start})",
                                         expected="a block header", found=f"{len(view) - pos} bytes")
            header = int.from_bytes(view[pos : pos + 3], "little")
            pos += 3
            block_type, size = (header >> 1) & 0x03, header >> 3
            if block_type == 3:
                raise DecompressionError(f"zstd block of the reserved type (at compressed byte {start})")
            pos += 1 if block_type == 1 else size
            bound += _ZSTD_BLOCK_MAX if block_type == 2 else size
            if header & 0x01:
                break
        pos += 4 if fhd & 0x04 else 0
        if pos > len(view):
            raise DecompressionError(f"zstd frame is truncated (at compressed byte {start})",
                                     expected=f"{pos - start} bytes",
                                     found=f"{len(view) - start} bytes")
        frames.append((start, pos, bound if content_size is None else content_size))
    return frames


def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
    """The compiled walk (``_proof.decompress``) where it answers, else :func:`zstd_reference`, which decides
    (None from the compiled walk is never a verdict; the fuzz target ``zstd`` compares the two)."""
    fast = _proof.decompress(data, limit) if _COMPILED_ZSTD and len(data) else None
    return fast if fast is not None else zstd_reference(data, limit)


def _compiled_zstd() -> bool:
    """Whether ``_proof`` loaded the very libzstd version the zstandard package decodes with (its own build):
    only then are the compiled decode's answers the reference's."""
    library = _proof.library()
    return library is not None and library.rsplit(" ", 1)[-1] == ".".join(map(str, zstandard.ZSTD_VERSION))


_COMPILED_ZSTD: Final = _compiled_zstd()


def zstd_reference(data: bytes | memoryview, limit: int) -> bytes:
    """Frame by frame: one-shot when the walk bounds the output within the limit, else a bounded stream."""
    if len(data) == 0:
        raise DecompressionError("empty zstd payload", expected="a zstd frame", found="0 bytes")
    view = memoryview(data)
    frames = _zstd_frames(view)
    if sum(bound for _, _, bound in frames) <= limit:
        d = _zstd_decompressor()
        out = []
        for start, end, bound in frames:
            if bound == 0:  # the one-shot call takes 0 for "unknown": stream it, and it must be empty
                _zstd_stream(view[start:end], 0)  # raises if the frame holds anything after all
                continue
            try:
                out.append(d.decompress(view[start:end], max_output_size=bound))
            except zstandard.ZstdError as e:
                raise DecompressionError(f"zstd: {e}") from e
        return out[0] if len(out) == 1 else b"".join(out)
    return _zstd_stream(view, limit)


def _zstd_stream(data: memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    try:
        with _zstd_decompressor().stream_reader(data, read_across_frames=True, closefd=False) as reader:
            while True:
                chunk = reader.read(min(_ZSTD_READ_CHUNK, limit - total + 1))
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise DecompressionError("zstd output exceeds the decompression limit",
                                             expected=f"<= {limit} bytes", found="more")
                out.append(chunk)
    except zstandard.ZstdError as e:
        raise DecompressionError(f"zstd: {e}") from e
    return out[0] if len(out) == 1 else b"".join(out)


# --- dispatch ---------------------------------------------------------------------------------


def decompress(codec: Codec, data: bytes | memoryview, *, magic: int = 2,
               limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> bytes:
    """Decompress one batch's records section (v2) or one wrapper's value (v0/v1)."""
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.GZIP:
        return _gzip_decompress(data, limit)
    if codec is Codec.SNAPPY:
        return _snappy_decompress(data, limit)
    if codec is Codec.LZ4:
        return _lz4_decompress(data, limit, magic)
    if codec is Codec.ZSTD:
        return _zstd_decompress(data, limit)
    raise DecompressionError("unknown codec", expected="0..4", found=int(codec))


def _one_zstd_frame(data: bytes | bytearray | memoryview, size: int) -> bool:
    """Whether ``data`` is exactly one zstd frame, nothing before or after it (what one-shot decoding reads
    whole), that does not declare a content size other than ``size``: the one-shot decoder allocates what a
    frame declares, whatever bound it is given. Anything else (a payload that is not walkable at all
    included) is left to :func:`decompress`, which reads it within ``size`` bytes of output."""
    try:
        frames = _zstd_frames(memoryview(data))
    except DecompressionError:
        return False
    if len(frames) != 1 or frames[0][0] != 0 or frames[0][1] != len(data):
        return False
    try:
        declared = zstandard.frame_content_size(data)  # -1: the frame does not declare its size
    except zstandard.ZstdError:  # a header libzstd refuses to read (a window past its maximum, say)
        return False
    return declared in (-1, size)


def decompress_known_size(codec: Codec, data: bytes | memoryview, size: int, *, magic: int = 2) -> bytes:
    """Decompress a payload whose decompressed size is known, at most ``size`` bytes of output.

    The rewriter's proof uses it on the bytes it just compressed. For zstd it takes the one-shot decoder,
    which reads only the FIRST frame, when the payload is exactly one frame; anything else (more frames,
    bytes after the frame) goes through :func:`decompress`, which reads all of it as Kafka does.
    """
    if codec is Codec.ZSTD and size > 0 and _one_zstd_frame(data, size):  # max_output_size=0 would mean "unknown"
        try:
            out: bytes = _zstd_decompressor().decompress(data, max_output_size=size)
        except zstandard.ZstdError as e:
            raise DecompressionError(f"zstd: {e}") from e
        return out
    return decompress(codec, data, magic=magic, limit=size)


def decompress_all_known_size(codec: Codec, payloads: Sequence[bytes | bytearray | memoryview],
                              sizes: Sequence[int]) -> Sequence[object]:
    """:func:`decompress_known_size` over a group of v2 payloads: the rewriter's proof where the compiled one
    (_proof.c) does not run (codecs other than zstd, or no libzstd). For zstd payloads that are one frame
    each it is one call for the whole group (the GIL released once, not once a batch). Each item of the
    result is a bytes-like object (zstd: the binding's buffer segments)."""
    if not payloads:
        return []  # (the binding's multi-frame call crashes the process on an empty list: SIGFPE)
    if codec is Codec.ZSTD and all(sizes) and all(_one_zstd_frame(p, n)
                                                  for p, n in zip(payloads, sizes, strict=True)):
        try:
            out = _zstd_decompressor().multi_decompress_to_buffer(
                list(payloads), decompressed_sizes=array("Q", sizes).tobytes())
        except zstandard.ZstdError as e:
            raise DecompressionError(f"zstd: {e}") from e
        return cast(Sequence[object], out)  # a collection of buffer segments: len() and indexing
    return [decompress_known_size(codec, memoryview(p), n) for p, n in zip(payloads, sizes, strict=True)]


def compressor(codec: Codec, level: int | None) -> Callable[[bytes | memoryview], bytes]:
    """The magic v2 compression function for ``codec`` and ``level``, resolved once (the rewriter's hot path)."""
    lvl = check_level(codec, level)
    if codec is Codec.ZSTD:
        assert lvl is not None
        return _zstd_compressor(lvl).compress
    return functools.partial(compress, codec, level=lvl)


def compress(codec: Codec, data: bytes | memoryview, *, level: int | None = None, magic: int = 2) -> bytes:
    """Compress ``data`` exactly as Kafka's Java producer would frame it for ``magic``."""
    lvl = check_level(codec, level)
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.GZIP:
        assert lvl is not None
        return _gzip_compress(data, lvl)
    if codec is Codec.SNAPPY:
        return _snappy_compress(data)
    if codec is Codec.LZ4:
        assert lvl is not None
        return _lz4_compress(data, lvl, magic)
    if codec is Codec.ZSTD:
        if magic < 2:
            raise ConfigError("zstd needs magic v2", expected="magic 2", found=f"magic {magic}")
        assert lvl is not None
        return _zstd_compressor(lvl).compress(data)
    raise ConfigError("unknown codec", expected="0..4", found=int(codec))

