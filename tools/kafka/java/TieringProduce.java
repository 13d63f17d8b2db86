// The Java producer of the broker tests (tests/kafka_broker): Kafka's own client writes deterministic records
// and prints what the broker acknowledged, one line per record, in the order of the offsets:
//   topic \t partition \t offset \t timestamp \t aborted(0/1) \t key-hex|- \t value-hex|- \t headers
// where headers is "-" or "k1=hex1,k2=hex2" (a header with a null value: "k=-"); keys of headers are ASCII.
// Compiled at test time (javac into tools/kafka/build/, see tests/kafka_broker/producers.py).
//
// usage: TieringProduce BOOTSTRAP TOPIC CODEC COUNT SEED MODE [BATCH_SIZE LINGER_MS]
//   MODE: plain | idempotent | txn (transactions of 10 records; every third one aborted)

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.Random;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class TieringProduce {
    private static final String[] WORDS = {"click", "view", "cart", "order", "user", "session", "page", "home",
        "search", "kafka", "segment", "broker", "tiering", "zstd", "latency", "region", "eu-west-1", "us-east-1"};

    private record Sent(ProducerRecord<byte[], byte[]> rec, RecordMetadata[] meta, boolean aborted) {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], codec = args[2];
        int count = Integer.parseInt(args[3]);
        long seed = Long.parseLong(args[4]);
        String mode = args[5];
        int batchSize = args.length > 6 ? Integer.parseInt(args[6]) : 65536;
        int linger = args.length > 7 ? Integer.parseInt(args[7]) : 20;

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, batchSize);
        p.put(ProducerConfig.LINGER_MS_CONFIG, linger);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, !mode.equals("plain"));
        if (mode.equals("txn")) p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "tiering-java-" + topic);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        Random rnd = new Random(seed);
        List<Sent> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            boolean txn = mode.equals("txn");
            if (txn) producer.initTransactions();
            int txnNo = 0;
            for (int i = 0; i < count; ) {
                int n = txn ? Math.min(10, count - i) : count;
                boolean abort = txn && txnNo % 3 == 2;
                if (txn) producer.beginTransaction();
                for (int j = 0; j < n && i < count; j++, i++) {
                    ProducerRecord<byte[], byte[]> rec = record(topic, codec, i, rnd);
                    RecordMetadata[] meta = new RecordMetadata[1];
                    producer.send(rec, (m, e) -> {
                        if (e != null) throw new RuntimeException(e);
                        meta[0] = m;
                    });
                    sent.add(new Sent(rec, meta, abort));
                }
                producer.flush();
                if (txn) {
                    if (abort) producer.abortTransaction(); else producer.commitTransaction();
                }
                txnNo++;
            }
            producer.flush();
        }
        sent.sort((a, b) -> Long.compare(a.meta[0].offset(), b.meta[0].offset()));
        StringBuilder out = new StringBuilder();
        HexFormat hex = HexFormat.of();
        for (Sent s : sent) {
            RecordMetadata m = s.meta[0];
            out.append(topic).append('\t').append(m.partition()).append('\t').append(m.offset()).append('\t')
               .append(m.timestamp()).append('\t').append(s.aborted ? 1 : 0).append('\t')
               .append(s.rec.key() == null ? "-" : hex.formatHex(s.rec.key())).append('\t')
               .append(s.rec.value() == null ? "-" : hex.formatHex(s.rec.value())).append('\t');
            List<String> hs = new ArrayList<>();
            for (Header h : s.rec.headers()) hs.add(h.key() + "=" + (h.value() == null ? "-" : hex.formatHex(h.value())));
            out.append(hs.isEmpty() ? "-" : String.join(",", hs)).append('\n');
        }
        System.out.print(out);
        System.out.flush();
    }

    private static ProducerRecord<byte[], byte[]> record(String topic, String codec, int i, Random rnd) {
        StringBuilder msg = new StringBuilder();
        int words = 8 + rnd.nextInt(40);
        for (int w = 0; w < words; w++) msg.append(w == 0 ? "" : " ").append(WORDS[rnd.nextInt(WORDS.length)]);
        String value = "{\"src\":\"java\",\"i\":" + i + ",\"codec\":\"" + codec + "\",\"n\":" + rnd.nextInt(1000000)
            + ",\"id\":\"" + String.format("%016x", rnd.nextLong()) + "\",\"msg\":\"" + msg + "\"}";
        byte[] key = i % 7 == 3 ? null : ("user-" + rnd.nextInt(500)).getBytes(StandardCharsets.UTF_8);
        byte[] val = i % 11 == 5 ? null : value.getBytes(StandardCharsets.UTF_8);
        ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, null, null, key, val);
        if (i % 3 == 0) {
            rec.headers().add("trace", ("t-" + i).getBytes(StandardCharsets.UTF_8));
            if (i % 9 == 0) rec.headers().add("empty", new byte[0]);
            if (i % 27 == 0) rec.headers().add("nullh", null);
        }
        return rec;
    }
}
