package setu.ingest;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

class IngestDedupTest {
  private static final StructType SCHEMA =
      new StructType()
          .add("topic", DataTypes.StringType)
          .add("partition", DataTypes.IntegerType)
          .add("producer", DataTypes.StringType)
          .add("seq", DataTypes.LongType)
          .add("incarnation", DataTypes.LongType)
          .add("record_ms", DataTypes.LongType)
          .add("message_id", DataTypes.StringType)
          .add("window_ms", DataTypes.LongType)
          .add("value", DataTypes.BinaryType);

  private static Row row(StructType schema, String producer, long seq, String id, Object... more) {
    List<Object> values =
        new ArrayList<>(
            List.of("setu.p.t.ingest", 0, producer == null ? "" : producer, seq, 0L, seq, id, 60_000L));
    if (producer == null) {
      values.set(2, null);
    }
    values.add(new byte[] {1, 2});
    values.addAll(List.of(more));
    return new GenericRowWithSchema(values.toArray(), schema);
  }

  private final TopicCounts counts = new TopicCounts();

  private List<Row> kept(List<Row> rows) {
    List<Row> out = new ArrayList<>();
    Iterator<Row> kept =
        IngestDedup.kept(
            rows.iterator(), new PartitionRule(60_000, 100, 100), new MemoryState(), counts);
    kept.forEachRemaining(out::add);
    return out;
  }

  @Test
  void keptRowsLeaveInTheirOrderAndDuplicatesStayBehind() {
    List<Row> rows =
        List.of(
            row(SCHEMA, "p", 1, "a"),
            row(SCHEMA, "p", 1, "a"),
            row(SCHEMA, null, 0, "m"),
            row(SCHEMA, "p", 2, "b"),
            row(SCHEMA, null, 0, "m"));
    List<Row> out = kept(rows);
    assertEquals(List.of(rows.get(0), rows.get(2), rows.get(3)), out);
    assertArrayEquals(new long[] {3, 2}, counts.value().get("setu.p.t.ingest"));
  }

  @Test
  void countsMergeAcrossTasksAndCopiesDoNotShareThem() {
    TopicCounts a = new TopicCounts();
    a.add(new TopicCounts.Decided("x", true));
    TopicCounts b = a.copy();
    b.add(new TopicCounts.Decided("x", false));
    b.add(new TopicCounts.Decided("y", true));
    a.merge(b);
    assertArrayEquals(new long[] {2, 1}, a.value().get("x"));
    assertArrayEquals(new long[] {1, 0}, a.value().get("y"));
    assertArrayEquals(new long[] {1, 1}, b.value().get("x"));
    b.reset();
    assertTrue(b.isZero());
  }

  @Test
  void withAMarkColumnEachKeptProducerRecordIsFollowedByItsMark() {
    StructType marked = SCHEMA.add("mark", DataTypes.BooleanType);
    List<Row> rows =
        List.of(
            row(marked, "p", 1, "a", false),
            row(marked, "p", 1, "a", false),
            row(marked, null, 0, "m", false));
    List<Row> out = kept(rows);
    assertEquals(3, out.size());
    assertEquals(rows.get(0), out.get(0));
    Row mark = out.get(1);
    assertEquals(Boolean.TRUE, mark.getAs("mark"));
    assertEquals("p", mark.getAs("producer"));
    assertEquals(1L, (long) mark.<Long>getAs("seq"));
    assertNull(mark.getAs("value"), "a mark does not carry the message");
    assertEquals(rows.get(2), out.get(2));
    assertFalse(out.get(2).<Boolean>getAs("mark"), "a record without a producer has no mark");
  }
}
