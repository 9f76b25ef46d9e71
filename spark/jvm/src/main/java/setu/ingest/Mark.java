package setu.ingest;

import java.io.Serializable;

/**
 * What the de-duplication remembers about one producer in one ingest partition: the highest
 * sequence accepted there, the partition clock when the producer was last seen, and the topic
 * incarnation the mark was built under. A bean, so that Spark's state store can encode it.
 */
public final class Mark implements Serializable {
  private static final long serialVersionUID = 1L;

  private long high;
  private long lastSeenMs;
  private long incarnation;

  /** An empty mark (Spark's bean encoder needs this constructor). */
  public Mark() {}

  public Mark(long high, long lastSeenMs, long incarnation) {
    this.high = high;
    this.lastSeenMs = lastSeenMs;
    this.incarnation = incarnation;
  }

  public long getHigh() {
    return high;
  }

  public void setHigh(long high) {
    this.high = high;
  }

  public long getLastSeenMs() {
    return lastSeenMs;
  }

  public void setLastSeenMs(long lastSeenMs) {
    this.lastSeenMs = lastSeenMs;
  }

  public long getIncarnation() {
    return incarnation;
  }

  public void setIncarnation(long incarnation) {
    this.incarnation = incarnation;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof Mark m
        && m.high == high
        && m.lastSeenMs == lastSeenMs
        && m.incarnation == incarnation;
  }

  @Override
  public int hashCode() {
    return Long.hashCode(high) * 31 * 31 + Long.hashCode(lastSeenMs) * 31 + Long.hashCode(incarnation);
  }

  @Override
  public String toString() {
    return "Mark(high=" + high + ", lastSeenMs=" + lastSeenMs + ", incarnation=" + incarnation + ")";
  }
}
