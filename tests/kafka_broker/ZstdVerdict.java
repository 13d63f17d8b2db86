import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;

import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.record.internal.RecordBatch;
import org.apache.kafka.common.utils.BufferSupplier;

/**
 * Kafka's own reading of zstd batch payloads: each file named on the command line is decoded as a broker or
 * a Java consumer decodes a v2 batch's records section (Compression.zstd().wrapForInput), and one line is
 * printed per file: "ok HEX" with the decoded bytes, or "error CLASS: MESSAGE".
 */
public class ZstdVerdict {
    public static void main(String[] args) throws Exception {
        var codec = Compression.zstd().build();
        for (String name : args) {
            byte[] frame = Files.readAllBytes(Path.of(name));
            try (InputStream in = codec.wrapForInput(ByteBuffer.wrap(frame), RecordBatch.MAGIC_VALUE_V2,
                    BufferSupplier.create())) {
                System.out.println("ok " + HexFormat.of().formatHex(in.readAllBytes()));
            } catch (Exception e) {
                System.out.println("error " + e.getClass().getName() + ": " + String.valueOf(e.getMessage()).replace('\n', ' '));
            }
        }
    }
}
