package setu.ingest;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class PartitionRuleTest {
  private static final long TTL = 1_000;
  private static final long WINDOW = 300;

  private final PartitionState state = new MemoryState();
  private PartitionRule rule = new PartitionRule(TTL, 3, 3);

  private boolean sequence(String producer, long sequence, long atMs) {
    return sequence(producer, sequence, atMs, 0);
  }

  private boolean sequence(String producer, long sequence, long atMs, long incarnation) {
    return rule.admit(state, new Incoming(producer, sequence, incarnation, atMs, "m", 0));
  }

  private boolean plain(String messageId, long atMs, long windowMs) {
    return rule.admit(state, new Incoming(null, 0, 0, atMs, messageId, windowMs));
  }

  @Test
  void aSequenceAtOrBelowTheProducersHighIsADuplicate() {
    assertTrue(sequence("p", 5, 10));
    assertFalse(sequence("p", 5, 11));
    assertFalse(sequence("p", 3, 12));
    assertTrue(sequence("p", 6, 13));
    assertTrue(sequence("q", 0, 14), "another producer has marks of its own");
  }

  @Test
  void aMarkStopsJudgingOnceItsProducerWasIdleForTheTtlOfThePartitionClock() {
    assertTrue(sequence("p", 5, 0));
    assertTrue(sequence("q", 1, TTL - 1), "another producer moves the clock");
    assertTrue(sequence("q", 2, TTL));
    assertTrue(sequence("p", 5, TTL), "expired: the resend is new again");
  }

  @Test
  void aDuplicateKeepsItsProducersMarkAlive() {
    assertTrue(sequence("p", 5, 0));
    assertFalse(sequence("p", 5, TTL - 1));
    assertFalse(sequence("p", 5, TTL + 5), "seen at TTL - 1, so judging until 2 TTL - 1");
  }

  @Test
  void theClockNeverGoesBackSoALateTimestampDoesNotRevive() {
    assertTrue(sequence("p", 5, 0));
    assertTrue(sequence("q", 1, TTL + 1));
    assertTrue(sequence("p", 5, 10), "judged at the partition clock, not its own timestamp");
  }

  @Test
  void beyondTheCapTheLeastRecentlySeenProducerIsForgotten() {
    assertTrue(sequence("a", 1, 1));
    assertTrue(sequence("b", 1, 2));
    assertTrue(sequence("c", 1, 3));
    assertTrue(sequence("a", 2, 4));
    assertTrue(sequence("d", 1, 5), "the fourth producer pushes out b, seen longest ago");
    assertTrue(sequence("b", 1, 6), "b was forgotten");
    assertFalse(sequence("a", 2, 7), "a was kept");
    assertEquals(3, rule.judgingMarks(state).size());
  }

  @Test
  void producersSeenAtTheSameTimeLeaveInCodePointOrder() {
    rule = new PartitionRule(TTL, 1, 3);
    // U+1D538 is a surrogate pair in UTF-16, below U+FF21 there and above it by code point.
    assertTrue(sequence("\uFF21", 1, 1));
    assertTrue(sequence("\uD835\uDD38", 1, 1));
    assertEquals(List.of("\uD835\uDD38"), List.copyOf(rule.judgingMarks(state).keySet()));
    assertTrue(PartitionRule.compareCodePoints("\uFF21", "\uD835\uDD38") < 0);
    assertTrue(PartitionRule.compareCodePoints("ab", "abc") < 0);
    assertEquals(0, PartitionRule.compareCodePoints("ab", "ab"));
  }

  @Test
  void aNewerIncarnationOfTheTopicDropsTheOlderMarks() {
    assertTrue(sequence("p", 5, 1, 100));
    assertTrue(sequence("p", 0, 2, 200), "the topic was created again: p starts over");
    assertTrue(sequence("p", 1, 3, 100), "a stale replica's stamp is judged as the current one");
    assertFalse(sequence("p", 1, 4, 200));
  }

  @Test
  void anOlderIncarnationStartsOverWhenNoMarkJudgesAnyMore() {
    assertTrue(sequence("p", 5, 0, 200));
    assertTrue(sequence("q", 9, TTL + 1, 100), "p expired: nothing of 200 judges");
    assertTrue(sequence("p", 1, TTL + 2, 200), "200 is newer than q's 100 and drops it");
    assertTrue(sequence("q", 9, TTL + 3, 200));
  }

  @Test
  void aMessageIdIsADuplicateWithinItsTopicsWindowOnly() {
    assertTrue(plain("m1", 0, WINDOW));
    assertFalse(plain("m1", WINDOW - 1, WINDOW));
    assertTrue(plain("m2", WINDOW, WINDOW), "moves the clock to the end of m1's window");
    assertTrue(plain("m1", WINDOW, WINDOW), "the window ended");
    assertTrue(plain("m3", WINDOW + 1, 0));
    assertTrue(plain("m3", WINDOW + 2, 0), "a window of 0 keeps every copy");
  }

  @Test
  void aMessageIdOfANewerIncarnationIsNotADuplicate() {
    assertTrue(rule.admit(state, new Incoming(null, 0, 100, 0, "m1", WINDOW)));
    assertTrue(rule.admit(state, new Incoming(null, 0, 200, 1, "m1", WINDOW)));
    assertFalse(rule.admit(state, new Incoming(null, 0, 100, 2, "m1", WINDOW)));
  }

  @Test
  void beyondTheIdCapTheIdWhoseWindowEndsFirstIsForgotten() {
    assertTrue(plain("m1", 0, WINDOW));
    assertTrue(plain("m2", 1, WINDOW));
    assertTrue(plain("m3", 2, WINDOW));
    assertTrue(plain("m4", 3, WINDOW));
    assertTrue(plain("m1", 4, WINDOW), "m1 was forgotten");
    assertFalse(plain("m3", 5, WINDOW));
  }

  @Test
  void producerRecordsAreNotJudgedByMessageId() {
    assertTrue(rule.admit(state, new Incoming(null, 0, 0, 0, "m1", WINDOW)));
    assertTrue(rule.admit(state, new Incoming("p", 0, 0, 1, "m1", WINDOW)));
  }

  @Test
  void aRestartedRuleDecidesAsTheOneThatKeptRunning() {
    PartitionState other = new MemoryState();
    PartitionRule running = new PartitionRule(TTL, 2, 2);
    List<Boolean> restarted = new ArrayList<>();
    List<Boolean> continued = new ArrayList<>();
    long[][] history = {{0, 1}, {1, 1}, {2, 1}, {0, 2}, {1, 0}, {3, 1}, {2, 1}, {0, 2}, {1, 3}};
    for (int i = 0; i < history.length; i++) {
      rule = new PartitionRule(TTL, 2, 2);
      Incoming record =
          new Incoming("p" + history[i][0], history[i][1], 0, i * 10L, "m" + (i % 3), WINDOW);
      restarted.add(rule.admit(state, record));
      continued.add(running.admit(other, record));
    }
    assertEquals(continued, restarted);
  }

  @Test
  void aPartitionIsSeededWithTheMicroBatchJobsMarksOfItsNewestIncarnation() {
    IngestDedup.seed(
        state,
        "[[\"setu.p.t.ingest\",\"p\",50,[[0,7]],200],[\"setu.p.t.ingest\",\"q\",80,[[0,3]],200],"
            + "[\"setu.p.t.ingest\",\"r\",90,[[0,3]],100]]");
    Map<String, Mark> marks = rule.judgingMarks(state);
    assertEquals(Map.of("p", new Mark(7, 50, 200), "q", new Mark(3, 80, 200)), marks);
    assertEquals(80, state.clock().getNowMs());
    assertFalse(sequence("p", 7, 81, 200));
    assertTrue(sequence("p", 8, 82, 200));
  }
}
