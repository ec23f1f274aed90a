package dev.sessionstream.example;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Sends one prompt to a session and prints its outcome and its events.
 *
 * <p>The command is JSON (sessionstream accepts JSON commands from any producer). Its outcome
 * is the one record the processor writes on session.outcomes for it, in the transaction of
 * its events, keyed "{sessionId}/{commandId}" on the session's partition; both outcome and
 * events are Avro in the Confluent wire format (0, a 4-byte schema id, the body), decoded
 * here with the schema the registry gives for that id.
 */
public final class SendAndWait {
    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }

    static final String BOOTSTRAP = env("SESSIONSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:9092");
    static final String REGISTRY =
            env("SESSIONSTREAM_SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7");
    static final String COMMANDS = env("SESSIONSTREAM_COMMANDS_TOPIC", "session.commands");
    static final String OUTCOMES = env("SESSIONSTREAM_OUTCOMES_TOPIC", "session.outcomes");
    static final String EVENTS = env("SESSIONSTREAM_EVENTS_TOPIC", "session.events");

    static final HttpClient HTTP = HttpClient.newHttpClient();
    static final Map<Integer, Schema> SCHEMAS = new HashMap<>();

    /** The writer schema of a registry id, fetched once (GET {registry}/schemas/ids/{id}). */
    static Schema schema(int id) throws Exception {
        Schema s = SCHEMAS.get(id);
        if (s == null) {
            HttpResponse<String> r = HTTP.send(
                    HttpRequest.newBuilder(URI.create(REGISTRY + "/schemas/ids/" + id)).build(),
                    HttpResponse.BodyHandlers.ofString());
            if (r.statusCode() != 200) throw new IllegalStateException("schema " + id + ": " + r.body());
            s = new Schema.Parser().parse(stringField(r.body(), "schema"));
            SCHEMAS.put(id, s);
        }
        return s;
    }

    /** The text of a top-level string field of a small JSON object (no JSON library). */
    static String stringField(String json, String name) {
        int i = json.indexOf("\"" + name + "\"");
        if (i < 0) throw new IllegalStateException("no " + name + " in " + json);
        i = json.indexOf('"', json.indexOf(':', i) + 1) + 1;
        StringBuilder out = new StringBuilder();
        while (true) {
            char c = json.charAt(i++);
            if (c == '"') return out.toString();
            if (c != '\\') { out.append(c); continue; }
            char n = json.charAt(i++);
            switch (n) {
                case 'n' -> out.append('\n');
                case 't' -> out.append('\t');
                case 'r' -> out.append('\r');
                case 'b' -> out.append('\b');
                case 'f' -> out.append('\f');
                case 'u' -> { out.append((char) Integer.parseInt(json.substring(i, i + 4), 16)); i += 4; }
                default -> out.append(n);
            }
        }
    }

    /** The Confluent wire format: 0, the schema id (big-endian), the Avro binary body. */
    static GenericRecord decode(byte[] value) throws Exception {
        if (value[0] != 0) throw new IllegalStateException("not registry-framed");
        int id = ByteBuffer.wrap(value, 1, 4).getInt();
        Schema writer = schema(id);
        return new GenericDatumReader<GenericRecord>(writer)
                .read(null, DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null));
    }

    static String json(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    public static void main(String[] args) throws Exception {
        String sessionId = args.length > 0 ? args[0] : "acme:java-" + UUID.randomUUID().toString().substring(0, 8);
        String text = args.length > 1 ? args[1] : "find flights to Lisbon";
        String tenant = sessionId.contains(":") ? sessionId.substring(0, sessionId.indexOf(':')) : "acme";
        String commandId = UUID.randomUUID().toString();
        long ts = System.currentTimeMillis();

        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"); // never an aborted record
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp)) {
            int partitions = consumer.partitionsFor(OUTCOMES).size();
            // the session's partition: Kafka's own murmur2 placement of its key
            int p = Utils.toPositive(Utils.murmur2(sessionId.getBytes(StandardCharsets.UTF_8))) % partitions;
            TopicPartition outTp = new TopicPartition(OUTCOMES, p);
            // its outcome comes after where the partition ends now
            long from = consumer.endOffsets(List.of(outTp)).get(outTp);

            Properties pp = new Properties();
            pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, BOOTSTRAP);
            pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
            pp.put(ProducerConfig.ACKS_CONFIG, "all");
            pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            String command = "{\"commandId\":" + json(commandId) + ",\"sessionId\":" + json(sessionId)
                    + ",\"tenantId\":" + json(tenant) + ",\"type\":\"prompt\",\"ts\":" + ts
                    + ",\"actor\":\"java:example\",\"payload\":{\"text\":" + json(text) + "}}";
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
                // the default partitioner places a keyed record with murmur2: the session's partition
                producer.send(new ProducerRecord<>(COMMANDS, sessionId, command)).get();
            }

            consumer.assign(List.of(outTp));
            consumer.seek(outTp, from);
            String key = sessionId + "/" + commandId;
            long deadline = System.currentTimeMillis() + 30_000;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    if (!key.equals(new String(r.key(), StandardCharsets.UTF_8))) continue;
                    GenericRecord o = decode(r.value());
                    if (!Long.valueOf(ts).equals(o.get("producerTs"))) continue; // another send of this id
                    System.out.printf("outcome %s run=%s reason=%s events=%s..%s%n", o.get("status"),
                            o.get("runId"), o.get("reason"), o.get("firstEventOffset"), o.get("lastEventOffset"));
                    Object first = o.get("firstEventOffset");
                    if (first != null) {
                        // its events, read at the offsets the outcome names
                        TopicPartition evTp = new TopicPartition(EVENTS, p);
                        consumer.assign(List.of(evTp));
                        consumer.seek(evTp, (Long) first);
                        long last = (Long) o.get("lastEventOffset");
                        int seen = 0;
                        while (seen < (Long) o.get("eventCount") && System.currentTimeMillis() < deadline) {
                            for (ConsumerRecord<byte[], byte[]> e : consumer.poll(Duration.ofMillis(200))) {
                                if (e.offset() > last) break;
                                GenericRecord ev = decode(e.value());
                                if (!commandId.equals(String.valueOf(ev.get("commandId")))) continue;
                                seen++;
                                System.out.printf("event %d %s run=%s seq=%s%n", e.offset(), ev.get("type"),
                                        ev.get("runId"), ev.get("seq"));
                            }
                        }
                    }
                    return;
                }
            }
            System.out.println("no outcome within 30 s");
            System.exit(1);
        }
    }
}
