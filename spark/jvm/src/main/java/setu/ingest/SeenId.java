package setu.ingest;

import java.io.Serializable;

/**
 * A message id seen in one ingest partition without a producer id: until when (partition clock)
 * a copy of it is a duplicate, and the topic incarnation it was seen under. A bean, for Spark's
 * state store.
 */
public final class SeenId implements Serializable {
  private static final long serialVersionUID = 1L;

  private long expiresMs;
  private long incarnation;

  /** An empty entry (Spark's bean encoder needs this constructor). */
  public SeenId() {}

  public SeenId(long expiresMs, long incarnation) {
    this.expiresMs = expiresMs;
    this.incarnation = incarnation;
  }

  public long getExpiresMs() {
    return expiresMs;
  }

  public void setExpiresMs(long expiresMs) {
    this.expiresMs = expiresMs;
  }

  public long getIncarnation() {
    return incarnation;
  }

  public void setIncarnation(long incarnation) {
    this.incarnation = incarnation;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof SeenId s && s.expiresMs == expiresMs && s.incarnation == incarnation;
  }

  @Override
  public int hashCode() {
    return Long.hashCode(expiresMs) * 31 + Long.hashCode(incarnation);
  }

  @Override
  public String toString() {
    return "SeenId(expiresMs=" + expiresMs + ", incarnation=" + incarnation + ")";
  }
}
