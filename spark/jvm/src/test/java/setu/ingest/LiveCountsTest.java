package setu.ingest;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.junit.jupiter.api.Test;

class LiveCountsTest {
  // A local master runs its tasks in this JVM, so a task can wait on it.
  private static final CountDownLatch RELEASE = new CountDownLatch(1);

  @Test
  void aRunningTasksCountsAreSeenBeforeItEndsAndCountedOnceAfter() throws Exception {
    SparkConf conf =
        new SparkConf()
            .setMaster("local[2]")
            .setAppName("live-counts-test")
            .set("spark.ui.enabled", "false")
            .set("spark.executor.heartbeatInterval", "200ms");
    try (JavaSparkContext context = new JavaSparkContext(conf)) {
      TopicCounts counts = TopicCounts.registered(context.sc());
      LiveCounts live = LiveCounts.listening(context.sc(), counts);
      Thread job =
          new Thread(
              () ->
                  context
                      .parallelize(List.of(1, 2, 3), 1)
                      .foreach(
                          x -> {
                            counts.add(new TopicCounts.Decided("t", x != 2));
                            if (x == 3) {
                              RELEASE.await(60, TimeUnit.SECONDS);
                            }
                          }));
      job.start();
      try {
        // Seen while the task still runs (it waits): the driver's accumulator has nothing yet
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (!equal(live.value(), 2, 1) && System.nanoTime() < deadline) {
          Thread.sleep(50);
        }
        assertArrayEquals(new long[] {2, 1}, live.value().get("t"));
        assertEquals(Map.of(), counts.value());
      } finally {
        RELEASE.countDown();
        job.join();
      }
      // Once the task ended, its final counts stand in for its last heartbeat's
      context.sc().listenerBus().waitUntilEmpty();
      assertArrayEquals(new long[] {2, 1}, counts.value().get("t"));
      assertArrayEquals(new long[] {2, 1}, live.value().get("t"));
    }
  }

  private static boolean equal(Map<String, long[]> counts, long kept, long dropped) {
    long[] n = counts.get("t");
    return n != null && n[0] == kept && n[1] == dropped;
  }
}
