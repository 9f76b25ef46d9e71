package setu.ingest;

import java.io.Serializable;

/**
 * The scalars of one ingest partition's de-duplication state: its clock (the newest record time
 * it has seen), the incarnation its producer marks were built under, and how many marks and
 * message ids it stores (live or not yet removed). A bean, for Spark's state store.
 */
public final class Clock implements Serializable {
  private static final long serialVersionUID = 1L;

  private long nowMs = PartitionRule.NO_TIME;
  private long incarnation = PartitionRule.NO_INCARNATION;
  private long marks;
  private long ids;

  /** A partition that has seen nothing (Spark's bean encoder needs this constructor). */
  public Clock() {}

  public Clock(long nowMs, long incarnation, long marks, long ids) {
    this.nowMs = nowMs;
    this.incarnation = incarnation;
    this.marks = marks;
    this.ids = ids;
  }

  public long getNowMs() {
    return nowMs;
  }

  public void setNowMs(long nowMs) {
    this.nowMs = nowMs;
  }

  public long getIncarnation() {
    return incarnation;
  }

  public void setIncarnation(long incarnation) {
    this.incarnation = incarnation;
  }

  public long getMarks() {
    return marks;
  }

  public void setMarks(long marks) {
    this.marks = marks;
  }

  public long getIds() {
    return ids;
  }

  public void setIds(long ids) {
    this.ids = ids;
  }

  Clock copy() {
    return new Clock(nowMs, incarnation, marks, ids);
  }
}
