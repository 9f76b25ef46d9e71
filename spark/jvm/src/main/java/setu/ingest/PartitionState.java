package setu.ingest;

import java.util.Map;

/**
 * Where one ingest partition's de-duplication state lives: Spark's state store in the job
 * ({@link IngestDedup}), a map in tests ({@link MemoryState}). {@link PartitionRule} is the only
 * writer, and it keeps the counts in {@link Clock} itself.
 */
public interface PartitionState {
  /** The partition's scalars; a fresh {@link Clock} when nothing is stored yet. */
  Clock clock();

  void clock(Clock clock);

  /** The producer's mark, or null. */
  Mark mark(String producer);

  void putMark(String producer, Mark mark);

  void removeMark(String producer);

  /** Every stored mark, in no particular order. */
  Iterable<Map.Entry<String, Mark>> marks();

  /** The message id's entry, or null. */
  SeenId seenId(String messageId);

  void putSeenId(String messageId, SeenId seen);

  void removeSeenId(String messageId);

  /** Every stored message id, in no particular order. */
  Iterable<Map.Entry<String, SeenId>> seenIds();

  /** Forgets every mark (the count in {@link Clock} is the rule's to reset). */
  void clearMarks();
}
