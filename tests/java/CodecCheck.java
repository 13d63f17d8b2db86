// Reads and writes compressed Kafka payloads with the Java codec libraries Kafka itself uses
// (snappy-java, lz4-java, zstd-jni, java.util.zip), for tests/kafka/test_java_codecs.py.
//
//   java CodecCheck read SEGMENT...
//       For every magic v2 batch of every SEGMENT, one JSON line: the stored and the computed CRC-32C
//       (java.util.zip.CRC32C over bytes [21, end)), the records section (offset 61 onward) decompressed
//       with the stream Kafka's CompressionType opens for the codec, its length and CRC-32, the records
//       counted by walking their length varints, the header's recordsCount, and the first 16 bytes of
//       the (compressed) records section in hex, to judge the framing.
//   java CodecCheck write INPUT OUTPREFIX...
//       For every (INPUT, OUTPREFIX) pair, INPUT compressed the way Kafka's producer streams records
//       into a batch (small writes), into OUTPREFIX.gzip, .snappy, .lz4 and .zstd.
//
// Kafka reads lz4 with its own KafkaLZ4BlockInputStream (not on this classpath); lz4-java's
// LZ4FrameInputStream reads the same frame format and is the closest available.

import com.github.luben.zstd.ZstdInputStreamNoFinalizer;
import com.github.luben.zstd.ZstdOutputStream;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.zip.CRC32;
import java.util.zip.CRC32C;
import java.util.zip.GZIPInputStream;
import java.util.zip.GZIPOutputStream;
import net.jpountz.lz4.LZ4FrameInputStream;
import net.jpountz.lz4.LZ4FrameOutputStream;
import org.xerial.snappy.SnappyInputStream;
import org.xerial.snappy.SnappyOutputStream;

public final class CodecCheck {
    private static final int LOG_OVERHEAD = 12;
    private static final int MAGIC_OFFSET = 16;
    private static final int CRC_OFFSET = 17;
    private static final int ATTRIBUTES_OFFSET = 21;
    private static final int RECORDS_COUNT_OFFSET = 57;
    private static final int RECORDS_OFFSET = 61;
    private static final String[] CODECS = {"none", "gzip", "snappy", "lz4", "zstd"};

    private CodecCheck() {
    }

    public static void main(String[] args) throws IOException {
        if (args.length >= 2 && args[0].equals("read")) {
            for (int i = 1; i < args.length; i++) {
                read(Paths.get(args[i]));
            }
        } else if (args.length >= 3 && args.length % 2 == 1 && args[0].equals("write")) {
            for (int i = 1; i < args.length; i += 2) {
                byte[] input = Files.readAllBytes(Paths.get(args[i]));
                for (int codec = 1; codec < CODECS.length; codec++) {
                    Files.write(Paths.get(args[i + 1] + "." + CODECS[codec]), compress(codec, input));
                }
            }
        } else {
            System.err.println("usage: CodecCheck read SEGMENT... | write INPUT OUTPREFIX...");
            System.exit(2);
        }
    }

    private static void read(Path path) throws IOException {
        byte[] segment = Files.readAllBytes(path);
        ByteBuffer buf = ByteBuffer.wrap(segment); // big-endian, as Kafka's format
        int pos = 0;
        while (pos < segment.length) {
            long baseOffset = buf.getLong(pos);
            int end = pos + LOG_OVERHEAD + buf.getInt(pos + 8);
            byte magic = buf.get(pos + MAGIC_OFFSET);
            if (magic != 2 || end > segment.length || end < pos + RECORDS_OFFSET) {
                throw new IOException(path + ": byte " + pos + ": not a whole magic v2 batch (magic " + magic + ")");
            }
            long storedCrc = Integer.toUnsignedLong(buf.getInt(pos + CRC_OFFSET));
            CRC32C crc32c = new CRC32C();
            crc32c.update(segment, pos + ATTRIBUTES_OFFSET, end - pos - ATTRIBUTES_OFFSET);
            int codec = buf.getShort(pos + ATTRIBUTES_OFFSET) & 0x07;
            int recordsCount = buf.getInt(pos + RECORDS_COUNT_OFFSET);
            byte[] records = decompress(codec, segment, pos + RECORDS_OFFSET, end - pos - RECORDS_OFFSET);
            CRC32 crc32 = new CRC32();
            crc32.update(records);
            StringBuilder head = new StringBuilder();
            for (int i = pos + RECORDS_OFFSET; i < Math.min(end, pos + RECORDS_OFFSET + 16); i++) {
                head.append(String.format("%02x", segment[i]));
            }
            System.out.printf(
                "{\"file\": \"%s\", \"position\": %d, \"base_offset\": %d, \"codec\": \"%s\", \"stored_crc\": %d, "
                    + "\"computed_crc\": %d, \"records_count\": %d, \"walked_records\": %d, "
                    + "\"uncompressed_length\": %d, \"uncompressed_crc32\": %d, \"head\": \"%s\"}%n",
                path.getFileName(), pos, baseOffset, CODECS[codec], storedCrc, crc32c.getValue(), recordsCount,
                walk(records), records.length, crc32.getValue(), head);
            pos = end;
        }
    }

    /** The decompression streams of Kafka's CompressionType (GzipCompression, SnappyCompression, ...). */
    private static InputStream decompressing(int codec, InputStream in) throws IOException {
        switch (codec) {
            case 0:
                return in;
            case 1:
                return new GZIPInputStream(in, 8 * 1024);
            case 2:
                return new SnappyInputStream(in);
            case 3:
                return new LZ4FrameInputStream(in);
            case 4:
                return new ZstdInputStreamNoFinalizer(in);
            default:
                throw new IOException("unknown codec " + codec);
        }
    }

    private static byte[] decompress(int codec, byte[] data, int offset, int length) throws IOException {
        try (InputStream in = decompressing(codec, new ByteArrayInputStream(data, offset, length))) {
            return in.readAllBytes();
        }
    }

    private static byte[] compress(int codec, byte[] input) throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        OutputStream out;
        switch (codec) {
            case 1:
                out = new GZIPOutputStream(bytes, 8 * 1024);
                break;
            case 2:
                out = new SnappyOutputStream(bytes);
                break;
            case 3:
                out = new LZ4FrameOutputStream(bytes, LZ4FrameOutputStream.BLOCKSIZE.SIZE_64KB,
                    LZ4FrameOutputStream.FLG.Bits.BLOCK_INDEPENDENCE);
                break;
            case 4:
                out = new ZstdOutputStream(bytes, 3);
                break;
            default:
                throw new IOException("unknown codec " + codec);
        }
        try (out) {
            // Kafka's producer appends record by record: feed the stream in small, uneven writes.
            int pos = 0;
            int step = 1;
            while (pos < input.length) {
                int n = Math.min(step, input.length - pos);
                out.write(input, pos, n);
                pos += n;
                step = step * 7 % 5003 + 1;
            }
        }
        return bytes.toByteArray();
    }

    /** Counts the records of an uncompressed v2 records section by their length varints; -1 if malformed. */
    private static int walk(byte[] records) {
        int pos = 0;
        int count = 0;
        while (pos < records.length) {
            long raw = 0;
            int shift = 0;
            while (true) {
                if (pos >= records.length || shift > 28) {
                    return -1;
                }
                int b = records[pos++] & 0xFF;
                raw |= (long) (b & 0x7F) << shift;
                if ((b & 0x80) == 0) {
                    break;
                }
                shift += 7;
            }
            long length = (raw >>> 1) ^ -(raw & 1);
            if (length < 0 || length > records.length - pos) {
                return -1;
            }
            pos += (int) length;
            count++;
        }
        return count;
    }
}
