package setu.ingest;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.Map;

/**
 * Runs {@link PartitionRule} over a history given as JSON, outside Spark: what the property test
 * {@code tests/unit/spark/test_jvm_rule.py} compares with {@code spark/dedup.py}'s decisions.
 *
 * <p>A history is a list of steps: {@code {"record": [producer, sequence, incarnation,
 * recordMs, messageId, windowMs]}} (producer and messageId may be null); {@code {"restart":
 * true}}, a new rule over the same state, as after a restart of the job; {@code {"seed":
 * marks}}, a new partition seeded with marks in the micro-batch job's stored form; and {@code
 * {"snapshot": true}}, which reports the marks that judge and the ids stored.
 */
public final class Replay {
  private static final ObjectMapper JSON = new ObjectMapper();

  private Replay() {}

  /** The decisions ({@code "keep"}) and snapshots ({@code "snapshots"}) of {@code history}. */
  public static String run(String history, long ttlMs, long maxMarks, long maxIds)
      throws IOException {
    ObjectNode out = JSON.createObjectNode();
    ArrayNode keep = out.putArray("keep");
    ArrayNode snapshots = out.putArray("snapshots");
    PartitionState state = new MemoryState();
    PartitionRule rule = new PartitionRule(ttlMs, maxMarks, maxIds);
    for (JsonNode step : JSON.readTree(history)) {
      if (step.has("record")) {
        JsonNode r = step.get("record");
        keep.add(
            rule.admit(
                state,
                new Incoming(
                    r.get(0).isNull() ? null : r.get(0).asText(),
                    r.get(1).asLong(),
                    r.get(2).asLong(),
                    r.get(3).asLong(),
                    r.get(4).isNull() ? null : r.get(4).asText(),
                    r.get(5).asLong())));
      } else if (step.has("restart")) {
        rule = new PartitionRule(ttlMs, maxMarks, maxIds);
      } else if (step.has("seed")) {
        state = new MemoryState();
        IngestDedup.seed(state, step.get("seed").asText());
        rule = new PartitionRule(ttlMs, maxMarks, maxIds);
      } else if (step.has("snapshot")) {
        snapshots.add(snapshot(rule, state));
      }
    }
    return JSON.writeValueAsString(out);
  }

  private static ObjectNode snapshot(PartitionRule rule, PartitionState state) {
    ObjectNode out = JSON.createObjectNode();
    Clock clock = state.clock();
    out.put("clock", clock.getNowMs());
    ObjectNode marks = out.putObject("marks");
    for (Map.Entry<String, Mark> entry : rule.judgingMarks(state).entrySet()) {
      Mark mark = entry.getValue();
      marks.putArray(entry.getKey())
          .add(mark.getHigh())
          .add(mark.getLastSeenMs())
          .add(mark.getIncarnation());
    }
    ObjectNode ids = out.putObject("ids");
    for (Map.Entry<String, SeenId> entry : state.seenIds()) {
      SeenId seen = entry.getValue();
      if (seen.getExpiresMs() > clock.getNowMs()) {
        ids.putArray(entry.getKey()).add(seen.getExpiresMs()).add(seen.getIncarnation());
      }
    }
    return out;
  }
}
