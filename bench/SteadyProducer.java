// The latency bench's Kafka publisher (bench/spark_latency.py): a steady rate of messages, each
// carrying the time it was sent.  Run as a single-file program on the broker's jars:
//
//   java -cp "<kafka jars>/*" bench/SteadyProducer.java BOOTSTRAP TOPIC PARTITIONS RATE SECONDS BYTES
//
// Message i is due at start + i / RATE; its value is the time of its send() in microseconds since
// the epoch, in decimal, padded with spaces to BYTES.  Partitions are taken in turn.  The producer
// keeps kafka-clients' defaults (linger.ms=0, acks=all, idempotence).  Prints the count sent.

import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class SteadyProducer {
    public static void main(String[] args) {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        double rate = Double.parseDouble(args[3]);
        double seconds = Double.parseDouble(args[4]);
        int size = Integer.parseInt(args[5]);
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        long total = (long) (rate * seconds);
        long sent = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            // The topic's metadata first: the first send() would otherwise wait for it, late.
            producer.partitionsFor(topic);
            long start = System.nanoTime();
            for (long i = 0; i < total; i++) {
                long due = start + (long) (i * 1e9 / rate);
                long ahead = due - System.nanoTime();
                if (ahead > 0) {
                    LockSupport.parkNanos(ahead);
                }
                Instant now = Instant.now();
                long micros = now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
                byte[] value = new byte[size];
                Arrays.fill(value, (byte) ' ');
                byte[] digits = Long.toString(micros).getBytes(StandardCharsets.US_ASCII);
                System.arraycopy(digits, 0, value, 0, digits.length);
                producer.send(new ProducerRecord<>(topic, (int) (i % partitions), null, value));
                sent++;
            }
            producer.flush();
        }
        System.out.println(sent);
    }
}
