// A changelog workload for the key-compaction benchmark (tests/kafka_broker/bench_cleaner.py), written by
// Kafka's own producer: COUNT updates of KEYS keys (key = KEYS * r^2: low keys change most), a JSON value of
// about 180 bytes, 3% tombstones, a plain producer. Prints the records and value bytes sent.
//
// usage: ChangelogProduce BOOTSTRAP TOPIC CODEC COUNT KEYS SEED

import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.Random;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ChangelogProduce {
    private static final String[] STATUS = {"new", "paid", "shipped", "done"};
    private static final String LETTERS = "abcdefghijklmnopqrstuvwxyz";

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], codec = args[2];
        int count = Integer.parseInt(args[3]), keys = Integer.parseInt(args[4]);
        Random rnd = new Random(Long.parseLong(args[5]));
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, 65536);
        p.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        p.put(ProducerConfig.ACKS_CONFIG, "1");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        long valueBytes = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                double r = rnd.nextDouble();
                int key = (int) (keys * r * r);
                byte[] value = null;
                if (rnd.nextDouble() >= 0.03) {
                    StringBuilder note = new StringBuilder();
                    for (int j = 0; j < 60; j++) note.append(LETTERS.charAt(rnd.nextInt(LETTERS.length())));
                    value = ("{\"id\":" + key + ",\"version\":" + i + ",\"status\":\"" + STATUS[rnd.nextInt(4)]
                             + "\",\"amount_cents\":" + (100 + rnd.nextInt(99900)) + ",\"note\":\"" + note + "\"}")
                            .getBytes(StandardCharsets.UTF_8);
                    valueBytes += value.length;
                }
                producer.send(new ProducerRecord<>(topic, 0, ("order-" + key).getBytes(StandardCharsets.UTF_8),
                                                   value), (m, e) -> {
                    if (e != null) throw new RuntimeException(e);
                });
            }
            producer.flush();
        }
        System.out.println(count + " " + valueBytes);
    }
}
