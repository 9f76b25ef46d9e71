package setu.ingest;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.Map;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;

class TopicCountsTest {
  @Test
  void countsAreEncodedALinePerTopic() {
    Map<String, long[]> counts = new TreeMap<>();
    counts.put("setu.p.a.ingest", new long[] {12, 3});
    counts.put("setu.p.b.ingest", new long[] {0, 1});
    assertEquals("setu.p.a.ingest 12 3\nsetu.p.b.ingest 0 1\n", TopicCounts.encode(counts));
    assertEquals("", TopicCounts.encode(Map.of()));
  }

  @Test
  void anAccumulatorsCountsAreReadEncoded() {
    TopicCounts counts = new TopicCounts();
    counts.add(new TopicCounts.Decided("t", true));
    counts.add(new TopicCounts.Decided("t", true));
    counts.add(new TopicCounts.Decided("t", false));
    assertEquals("t 2 1\n", counts.encoded());
  }
}
