package setu.ingest;

import java.util.Comparator;
import java.util.Map;
import java.util.TreeSet;

/**
 * The de-duplication rule of one ingest partition, one record at a time (docs/ingest.md,
 * "De-duplication"). It is {@code spark/dedup.py}'s rule with every record judged as a batch of
 * its own, and a partition clock that never goes back; {@code tests/unit/spark/test_jvm_rule.py}
 * feeds random histories to both and requires the same decisions.
 *
 * <p><b>Producer sequences.</b> Per producer the partition keeps the highest sequence accepted;
 * a record whose sequence is not above it is a duplicate. A mark stops judging once its producer
 * has been idle for {@code ttlMs} of the partition clock (the newest record time the partition
 * has seen), and at most {@code maxMarks} marks are kept: beyond that the least recently seen are
 * forgotten (ties: the smaller producer id first). Marks belong to one incarnation of their
 * topic: a record of a newer incarnation drops them, and a record of an older one is judged as
 * one of the current incarnation while any mark of it still judges.
 *
 * <p><b>Message ids.</b> A record without a producer id whose topic has a window ({@code
 * windowMs} &gt; 0) is a duplicate when its message id was kept within the window before, under
 * the same or a newer incarnation. At most {@code maxIds} ids are kept; beyond that those whose
 * window ends first are forgotten.
 *
 * <p>Expired marks and ids are removed only when a bound is reached; until then they are stored
 * but never judge. Removing them later decides exactly as removing them at once would, because
 * the clock never goes back: what is expired stays expired. Finding the oldest needs an order
 * the state store does not keep, so the rule builds one in memory from the stored entries the
 * first time it needs it and keeps it up to date from then on.
 */
public final class PartitionRule {
  /** Below every sequence (sequences are 0..2^63-1). */
  public static final long NO_SEQUENCE = -1;

  /** Before the partition's first record ({@code spark.dedup_stream.NO_TIME}). */
  public static final long NO_TIME = -(1L << 62);

  /** Before the partition's first record with a producer id (stamped incarnations are >= 0). */
  public static final long NO_INCARNATION = -1;

  private record Aged(long at, String name) {}

  /** By time, then by name in code point order (as Python orders strings). */
  private static final Comparator<Aged> OLDEST_FIRST =
      Comparator.comparingLong(Aged::at).thenComparing(Aged::name, PartitionRule::compareCodePoints);

  private final long ttlMs;
  private final long maxMarks;
  private final long maxIds;
  private TreeSet<Aged> marksByAge;
  private TreeSet<Aged> idsByExpiry;

  /**
   * @param ttlMs how long a producer's mark judges after the producer was last seen
   * @param maxMarks how many producer marks the partition keeps at most
   * @param maxIds how many message ids the partition keeps at most
   */
  public PartitionRule(long ttlMs, long maxMarks, long maxIds) {
    this.ttlMs = ttlMs;
    this.maxMarks = maxMarks;
    this.maxIds = maxIds;
  }

  /**
   * True if {@code record} is new, and then the state remembers it; false if it is a duplicate.
   * Records must be offered in the partition's offset order.
   */
  public boolean admit(PartitionState state, Incoming record) {
    Clock clock = state.clock();
    clock.setNowMs(Math.max(clock.getNowMs(), record.recordMs()));
    boolean keep =
        record.producer() != null
            ? admitSequence(state, clock, record)
            : admitMessageId(state, clock, record);
    state.clock(clock);
    return keep;
  }

  private boolean admitSequence(PartitionState state, Clock clock, Incoming record) {
    long current = record.incarnation();
    if (clock.getIncarnation() > current && anyMarkJudges(state, clock)) {
      current = clock.getIncarnation();
    }
    if (clock.getIncarnation() != current) {
      // Every stored mark is of another incarnation, or none judges any more.
      state.clearMarks();
      clock.setMarks(0);
      clock.setIncarnation(current);
      if (marksByAge != null) {
        marksByAge.clear();
      }
    }
    Mark mark = state.mark(record.producer());
    long high = mark != null && judges(mark, clock) ? mark.getHigh() : NO_SEQUENCE;
    boolean keep = record.sequence() > high;
    if (mark == null) {
      clock.setMarks(clock.getMarks() + 1);
    } else if (marksByAge != null) {
      marksByAge.remove(new Aged(mark.getLastSeenMs(), record.producer()));
    }
    state.putMark(
        record.producer(), new Mark(Math.max(high, record.sequence()), clock.getNowMs(), current));
    if (marksByAge != null) {
      marksByAge.add(new Aged(clock.getNowMs(), record.producer()));
    }
    if (clock.getMarks() > maxMarks) {
      TreeSet<Aged> byAge = marksByAge(state);
      while (!byAge.isEmpty()
          && (byAge.first().at() + ttlMs <= clock.getNowMs() || clock.getMarks() > maxMarks)) {
        state.removeMark(byAge.pollFirst().name());
        clock.setMarks(clock.getMarks() - 1);
      }
    }
    return keep;
  }

  private boolean admitMessageId(PartitionState state, Clock clock, Incoming record) {
    if (record.windowMs() <= 0 || record.messageId() == null) {
      return true;
    }
    SeenId seen = state.seenId(record.messageId());
    if (seen != null
        && seen.getExpiresMs() > clock.getNowMs()
        && seen.getIncarnation() >= record.incarnation()) {
      return false;
    }
    if (seen == null) {
      clock.setIds(clock.getIds() + 1);
    } else if (idsByExpiry != null) {
      idsByExpiry.remove(new Aged(seen.getExpiresMs(), record.messageId()));
    }
    SeenId next = new SeenId(clock.getNowMs() + record.windowMs(), record.incarnation());
    state.putSeenId(record.messageId(), next);
    if (idsByExpiry != null) {
      idsByExpiry.add(new Aged(next.getExpiresMs(), record.messageId()));
    }
    if (clock.getIds() > maxIds) {
      TreeSet<Aged> byExpiry = idsByExpiry(state);
      while (!byExpiry.isEmpty()
          && (byExpiry.first().at() <= clock.getNowMs() || clock.getIds() > maxIds)) {
        state.removeSeenId(byExpiry.pollFirst().name());
        clock.setIds(clock.getIds() - 1);
      }
    }
    return true;
  }

  private boolean judges(Mark mark, Clock clock) {
    return mark.getLastSeenMs() + ttlMs > clock.getNowMs();
  }

  /** True if a stored mark still judges: the most recently seen one has not expired. */
  private boolean anyMarkJudges(PartitionState state, Clock clock) {
    if (clock.getMarks() == 0) {
      return false;
    }
    TreeSet<Aged> byAge = marksByAge(state);
    return !byAge.isEmpty() && byAge.last().at() + ttlMs > clock.getNowMs();
  }

  private TreeSet<Aged> marksByAge(PartitionState state) {
    if (marksByAge == null) {
      marksByAge = new TreeSet<>(OLDEST_FIRST);
      for (Map.Entry<String, Mark> entry : state.marks()) {
        marksByAge.add(new Aged(entry.getValue().getLastSeenMs(), entry.getKey()));
      }
    }
    return marksByAge;
  }

  private TreeSet<Aged> idsByExpiry(PartitionState state) {
    if (idsByExpiry == null) {
      idsByExpiry = new TreeSet<>(OLDEST_FIRST);
      for (Map.Entry<String, SeenId> entry : state.seenIds()) {
        idsByExpiry.add(new Aged(entry.getValue().getExpiresMs(), entry.getKey()));
      }
    }
    return idsByExpiry;
  }

  /** The marks that still judge, as the producer marks to publish (for a whole partition). */
  public Map<String, Mark> judgingMarks(PartitionState state) {
    Clock clock = state.clock();
    Map<String, Mark> out = new java.util.TreeMap<>();
    for (Map.Entry<String, Mark> entry : state.marks()) {
      if (judges(entry.getValue(), clock)) {
        out.put(entry.getKey(), entry.getValue());
      }
    }
    return out;
  }

  /** Strings compared by code point, as Python compares them (not by UTF-16 unit). */
  static int compareCodePoints(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int x = a.codePointAt(i);
      int y = b.codePointAt(j);
      if (x != y) {
        return Integer.compare(x, y);
      }
      i += Character.charCount(x);
      j += Character.charCount(y);
    }
    return Boolean.compare(i < a.length(), j < b.length());
  }
}
