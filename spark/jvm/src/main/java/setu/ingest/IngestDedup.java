package setu.ingest;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessorWithInitialState;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The ingest job's de-duplication as a Spark stateful operator (docs/ingest.md,
 * "De-duplication"; decision 0008). Records are grouped by ingest (topic, partition), so each
 * partition's records reach one operator task in offset order, and {@link PartitionRule} decides
 * them one at a time against the partition's state in Spark's state store. Kept records leave
 * in the order they came, as soon as they are decided: the operator runs in Spark's real-time
 * mode, where a record must not wait for the end of a batch.
 *
 * <p>The input rows need the columns {@code topic} (string), {@code partition} (int), {@code
 * producer} (string, null without a producer id), {@code seq}, {@code incarnation}, {@code
 * record_ms}, {@code window_ms} (long) and {@code message_id} (string); every column passes
 * through unchanged. The PySpark job applies it with {@link #apply}.
 *
 * <p><b>Marks.</b> When the rows have a boolean column {@code mark} (false on every input row),
 * each kept record with a producer id is followed by a copy of it with {@code mark} true and a
 * null {@code value}: the producer's new mark in that partition, for the job to write to the
 * producer marks changelog as the record is written to its main log.
 */
public final class IngestDedup extends StatefulProcessorWithInitialState<String, Row, Row, String> {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();

  private final long ttlMs;
  private final long maxMarks;
  private final long maxIds;
  private final TopicCounts counts;
  private transient SparkState state;
  private transient Map<String, PartitionRule> rules;

  /** {@code counts}, when not null, counts each topic's records kept and dropped. */
  public IngestDedup(long ttlMs, long maxMarks, long maxIds, TopicCounts counts) {
    this.ttlMs = ttlMs;
    this.maxMarks = maxMarks;
    this.maxIds = maxIds;
    this.counts = counts;
  }

  /**
   * {@code rows} de-duplicated, each ingest partition's kept rows in their order. {@code
   * initial}, when not null, seeds partitions that have no state yet: rows of {@code topic},
   * {@code partition} and {@code marks} (a partition's marks as the micro-batch job stored them,
   * {@code spark.dedup.encode_marks}). {@code counts}, when not null, counts each topic's
   * records kept and dropped ({@link TopicCounts#registered}).
   */
  public static Dataset<Row> apply(
      Dataset<Row> rows,
      Dataset<Row> initial,
      long ttlMs,
      long maxMarks,
      long maxIds,
      TopicCounts counts) {
    KeyValueGroupedDataset<String, Row> grouped =
        rows.groupByKey((MapFunction<Row, String>) IngestDedup::keyOf, Encoders.STRING());
    IngestDedup processor = new IngestDedup(ttlMs, maxMarks, maxIds, counts);
    if (initial == null) {
      return grouped.transformWithState(
          processor, TimeMode.None(), OutputMode.Update(), Encoders.row(rows.schema()));
    }
    KeyValueGroupedDataset<String, String> seeds =
        initial
            .groupByKey((MapFunction<Row, String>) IngestDedup::keyOf, Encoders.STRING())
            .mapValues((MapFunction<Row, String>) r -> r.getAs("marks"), Encoders.STRING());
    return grouped.transformWithState(
        processor,
        TimeMode.None(),
        OutputMode.Update(),
        seeds,
        Encoders.row(rows.schema()),
        Encoders.STRING());
  }

  static String keyOf(Row row) {
    return row.<String>getAs("topic") + ":" + row.<Integer>getAs("partition");
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    ValueState<Clock> clock =
        getHandle().getValueState("clock", Encoders.bean(Clock.class), TTLConfig.NONE());
    MapState<String, Mark> marks =
        getHandle()
            .getMapState("marks", Encoders.STRING(), Encoders.bean(Mark.class), TTLConfig.NONE());
    MapState<String, SeenId> ids =
        getHandle()
            .getMapState("ids", Encoders.STRING(), Encoders.bean(SeenId.class), TTLConfig.NONE());
    state = new SparkState(clock, marks, ids);
    rules = new HashMap<>();
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      String key, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
    PartitionRule rule = rules.computeIfAbsent(key, k -> new PartitionRule(ttlMs, maxMarks, maxIds));
    return CollectionConverters.asScala(
        kept(CollectionConverters.asJava(rows), rule, state, counts));
  }

  /**
   * The rows of one partition that {@code rule} keeps (with their marks), decided lazily, each
   * decision counted in {@code counts} unless it is null.
   */
  static Iterator<Row> kept(
      Iterator<Row> rows, PartitionRule rule, PartitionState state, TopicCounts counts) {
    return new Kept(rows, rule, state, counts);
  }

  @Override
  public void handleInitialState(String key, String marks, TimerValues timerValues) {
    if (state.clock().getNowMs() != PartitionRule.NO_TIME) {
      return; // the partition has state of its own already
    }
    seed(state, marks);
  }

  /**
   * Seeds an empty partition state with marks as the micro-batch job stored them: the marks of
   * the newest incarnation, and a clock at the newest of their last sights.
   */
  static void seed(PartitionState state, String encoded) {
    JsonNode items;
    try {
      items = JSON.readTree(encoded);
    } catch (IOException e) {
      throw new UncheckedIOException("unreadable de-duplication marks", e);
    }
    long incarnation = PartitionRule.NO_INCARNATION;
    for (JsonNode item : items) {
      incarnation = Math.max(incarnation, item.size() > 4 ? item.get(4).asLong() : 0);
    }
    long now = PartitionRule.NO_TIME;
    long count = 0;
    for (JsonNode item : items) {
      long markIncarnation = item.size() > 4 ? item.get(4).asLong() : 0;
      JsonNode partitions = item.get(3);
      if (markIncarnation != incarnation || partitions.isEmpty()) {
        continue;
      }
      now = Math.max(now, item.get(2).asLong());
      long high = PartitionRule.NO_SEQUENCE;
      for (JsonNode pair : partitions) {
        high = Math.max(high, pair.get(1).asLong());
      }
      state.putMark(item.get(1).asText(), new Mark(high, item.get(2).asLong(), incarnation));
      count++;
    }
    state.clock(new Clock(now, incarnation, count, 0));
  }

  /** The rows {@code rule} keeps, decided one at a time as they are pulled. */
  private static final class Kept implements Iterator<Row> {
    private final Iterator<Row> input;
    private final PartitionRule rule;
    private final PartitionState state;
    private final TopicCounts counts;
    private final ArrayDeque<Row> ready = new ArrayDeque<>(2);
    private Columns columns;

    Kept(Iterator<Row> input, PartitionRule rule, PartitionState state, TopicCounts counts) {
      this.input = input;
      this.rule = rule;
      this.state = state;
      this.counts = counts;
    }

    @Override
    public boolean hasNext() {
      while (ready.isEmpty() && input.hasNext()) {
        Row row = input.next();
        if (columns == null) {
          columns = new Columns(row);
        }
        Incoming incoming = columns.incoming(row);
        boolean keep = rule.admit(state, incoming);
        if (counts != null) {
          counts.add(new TopicCounts.Decided(row.getString(columns.topic), keep));
        }
        if (keep) {
          ready.add(row);
          if (incoming.producer() != null && columns.mark >= 0) {
            ready.add(columns.markOf(row));
          }
        }
      }
      return !ready.isEmpty();
    }

    @Override
    public Row next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      return ready.poll();
    }
  }

  /** Where the fields the rule reads sit in the input rows. */
  private static final class Columns {
    private final int topic;
    private final int producer;
    private final int sequence;
    private final int incarnation;
    private final int recordMs;
    private final int messageId;
    private final int windowMs;
    private final int mark;
    private final int value;

    Columns(Row row) {
      topic = row.fieldIndex("topic");
      producer = row.fieldIndex("producer");
      sequence = row.fieldIndex("seq");
      incarnation = row.fieldIndex("incarnation");
      recordMs = row.fieldIndex("record_ms");
      messageId = row.fieldIndex("message_id");
      windowMs = row.fieldIndex("window_ms");
      mark = optional(row, "mark");
      value = optional(row, "value");
    }

    private static int optional(Row row, String name) {
      try {
        return row.fieldIndex(name);
      } catch (IllegalArgumentException absent) {
        return -1;
      }
    }

    /** The mark row that follows a kept record: the record without its value, marked. */
    Row markOf(Row row) {
      Object[] values = new Object[row.length()];
      for (int i = 0; i < values.length; i++) {
        values[i] = i == value ? null : row.get(i);
      }
      values[mark] = Boolean.TRUE;
      return new GenericRowWithSchema(values, row.schema());
    }

    Incoming incoming(Row row) {
      boolean hasProducer = !row.isNullAt(producer);
      return new Incoming(
          hasProducer ? row.getString(producer) : null,
          hasProducer && !row.isNullAt(sequence) ? row.getLong(sequence) : 0,
          row.isNullAt(incarnation) ? 0 : row.getLong(incarnation),
          row.getLong(recordMs),
          row.isNullAt(messageId) ? null : row.getString(messageId),
          row.isNullAt(windowMs) ? 0 : row.getLong(windowMs));
    }
  }

  /** {@link PartitionState} in the operator's state variables (keyed by the current group). */
  private static final class SparkState implements PartitionState {
    private final ValueState<Clock> clock;
    private final MapState<String, Mark> marks;
    private final MapState<String, SeenId> ids;

    SparkState(ValueState<Clock> clock, MapState<String, Mark> marks, MapState<String, SeenId> ids) {
      this.clock = clock;
      this.marks = marks;
      this.ids = ids;
    }

    @Override
    public Clock clock() {
      return clock.exists() ? clock.get() : new Clock();
    }

    @Override
    public void clock(Clock value) {
      clock.update(value);
    }

    @Override
    public Mark mark(String producer) {
      // One state store read: getValue is null for an absent key.
      return marks.getValue(producer);
    }

    @Override
    public void putMark(String producer, Mark mark) {
      marks.updateValue(producer, mark);
    }

    @Override
    public void removeMark(String producer) {
      marks.removeKey(producer);
    }

    @Override
    public Iterable<Map.Entry<String, Mark>> marks() {
      return () -> entries(marks.iterator());
    }

    @Override
    public SeenId seenId(String messageId) {
      return ids.getValue(messageId);
    }

    @Override
    public void putSeenId(String messageId, SeenId seen) {
      ids.updateValue(messageId, seen);
    }

    @Override
    public void removeSeenId(String messageId) {
      ids.removeKey(messageId);
    }

    @Override
    public Iterable<Map.Entry<String, SeenId>> seenIds() {
      return () -> entries(ids.iterator());
    }

    @Override
    public void clearMarks() {
      marks.clear();
    }


    private static <V> Iterator<Map.Entry<String, V>> entries(
        scala.collection.Iterator<scala.Tuple2<String, V>> pairs) {
      Iterator<scala.Tuple2<String, V>> each = CollectionConverters.asJava(pairs);
      return new Iterator<>() {
        @Override
        public boolean hasNext() {
          return each.hasNext();
        }

        @Override
        public Map.Entry<String, V> next() {
          scala.Tuple2<String, V> pair = each.next();
          return Map.entry(pair._1(), pair._2());
        }
      };
    }
  }
}
