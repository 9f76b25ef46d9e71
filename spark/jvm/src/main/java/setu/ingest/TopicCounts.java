package setu.ingest;

import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SparkContext;
import org.apache.spark.util.AccumulatorV2;
import scala.Option;

/**
 * Per ingest topic, the records the operator kept and dropped as duplicates: a Spark
 * accumulator the driver reads for the ingest metrics ({@code setu_ingest_messages_total}).
 * Spark merges a task's counts when the task ends: every batch in micro-batches, at the end of
 * each long batch in real-time mode.
 */
public final class TopicCounts extends AccumulatorV2<TopicCounts.Decided, Map<String, long[]>> {
  private static final long serialVersionUID = 1L;

  /** One decision: a record of {@code topic} kept or dropped. */
  public record Decided(String topic, boolean kept) {}

  private final HashMap<String, long[]> counts = new HashMap<>();

  /** A new accumulator registered with {@code context}, for the driver to read. */
  public static TopicCounts registered(SparkContext context) {
    TopicCounts counts = new TopicCounts();
    counts.register(context, Option.apply("setu-ingest-topic-counts"), false);
    return counts;
  }

  @Override
  public synchronized boolean isZero() {
    return counts.isEmpty();
  }

  @Override
  public synchronized TopicCounts copy() {
    TopicCounts out = new TopicCounts();
    counts.forEach((topic, n) -> out.counts.put(topic, n.clone()));
    return out;
  }

  @Override
  public synchronized void reset() {
    counts.clear();
  }

  @Override
  public synchronized void add(Decided decided) {
    counts.computeIfAbsent(decided.topic(), t -> new long[2])[decided.kept() ? 0 : 1]++;
  }

  @Override
  public void merge(AccumulatorV2<Decided, Map<String, long[]>> other) {
    Map<String, long[]> theirs = other.value();
    synchronized (this) {
      theirs.forEach(
          (topic, n) -> {
            long[] mine = counts.computeIfAbsent(topic, t -> new long[2]);
            mine[0] += n[0];
            mine[1] += n[1];
          });
    }
  }

  /** A copy: ingest topic to {kept, dropped}. */
  @Override
  public synchronized Map<String, long[]> value() {
    Map<String, long[]> out = new HashMap<>();
    counts.forEach((topic, n) -> out.put(topic, n.clone()));
    return out;
  }

  /** {@link #value()} as {@link #encode} writes it: one call for the driver to read. */
  public String encoded() {
    return encode(value());
  }

  /**
   * Counts as text, a line {@code "<topic> <kept> <dropped>"} per topic (topic names hold no
   * spaces): the driver reads every topic's counts in one call, not two per topic.
   */
  public static String encode(Map<String, long[]> counts) {
    StringBuilder out = new StringBuilder();
    counts.forEach(
        (topic, n) ->
            out.append(topic).append(' ').append(n[0]).append(' ').append(n[1]).append('\n'));
    return out.toString();
  }
}
