package setu.ingest;

import java.util.HashMap;
import java.util.Map;

/** A {@link PartitionState} in plain maps: for tests, and to replay a history outside Spark. */
public final class MemoryState implements PartitionState {
  private Clock clock = new Clock();
  private final Map<String, Mark> marks = new HashMap<>();
  private final Map<String, SeenId> ids = new HashMap<>();

  @Override
  public Clock clock() {
    return clock.copy();
  }

  @Override
  public void clock(Clock clock) {
    this.clock = clock.copy();
  }

  @Override
  public Mark mark(String producer) {
    Mark mark = marks.get(producer);
    return mark == null ? null : new Mark(mark.getHigh(), mark.getLastSeenMs(), mark.getIncarnation());
  }

  @Override
  public void putMark(String producer, Mark mark) {
    marks.put(producer, new Mark(mark.getHigh(), mark.getLastSeenMs(), mark.getIncarnation()));
  }

  @Override
  public void removeMark(String producer) {
    marks.remove(producer);
  }

  @Override
  public Iterable<Map.Entry<String, Mark>> marks() {
    return Map.copyOf(marks).entrySet();
  }

  @Override
  public SeenId seenId(String messageId) {
    return ids.get(messageId);
  }

  @Override
  public void putSeenId(String messageId, SeenId seen) {
    ids.put(messageId, new SeenId(seen.getExpiresMs(), seen.getIncarnation()));
  }

  @Override
  public void removeSeenId(String messageId) {
    ids.remove(messageId);
  }

  @Override
  public Iterable<Map.Entry<String, SeenId>> seenIds() {
    return Map.copyOf(ids).entrySet();
  }

  @Override
  public void clearMarks() {
    marks.clear();
  }

}
