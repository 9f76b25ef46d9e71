package setu.ingest;

import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SparkContext;
import org.apache.spark.scheduler.AccumulableInfo;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorMetricsUpdate;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import scala.Option;
import scala.Tuple4;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The operator's {@link TopicCounts} as they grow, read on the driver while the tasks still run.
 *
 * <p>Spark merges an accumulator into the driver's copy only when a task ends: in real-time mode
 * a task lasts the whole batch (30 s), so the ingest metrics would move in steps of a batch.
 * Executors also send every running task's accumulators with their heartbeats ({@code
 * spark.executor.heartbeatInterval}); this listener keeps each running task's latest counts,
 * replaces them with the task's own final counts when it ends, and adds both up. A task that
 * fails takes its counts with it (its records are read again), so a total can go back: readers
 * keep the highest they saw.
 */
public final class LiveCounts extends SparkListener {
  private final long accumulatorId;
  private final HashMap<Long, Map<String, long[]>> running = new HashMap<>();
  private final HashMap<String, long[]> finished = new HashMap<>();

  LiveCounts(long accumulatorId) {
    this.accumulatorId = accumulatorId;
  }

  /** A listener of {@code counts}, added to {@code context}'s listener bus. */
  public static LiveCounts listening(SparkContext context, TopicCounts counts) {
    LiveCounts live = new LiveCounts(counts.id());
    context.addSparkListener(live);
    return live;
  }

  @Override
  public void onExecutorMetricsUpdate(SparkListenerExecutorMetricsUpdate update) {
    for (Tuple4<Object, Object, Object, scala.collection.immutable.Seq<AccumulableInfo>> task :
        CollectionConverters.asJava(update.accumUpdates())) {
      Map<String, long[]> counts = countsIn(task._4());
      if (counts != null) {
        synchronized (this) {
          running.put((Long) task._1(), counts);
        }
      }
    }
  }

  @Override
  public void onTaskEnd(SparkListenerTaskEnd end) {
    Map<String, long[]> counts = countsIn(end.taskInfo().accumulables());
    synchronized (this) {
      running.remove(end.taskInfo().taskId());
      if (counts != null) {
        add(finished, counts);
      }
    }
  }

  /** Ingest topic to {kept, dropped}: the ended tasks' counts and the running ones' latest. */
  public synchronized Map<String, long[]> value() {
    HashMap<String, long[]> out = new HashMap<>();
    add(out, finished);
    running.values().forEach(counts -> add(out, counts));
    return out;
  }

  /** {@link #value()} as {@link TopicCounts#encode} writes it. */
  public String encoded() {
    return TopicCounts.encode(value());
  }

  private Map<String, long[]> countsIn(scala.collection.immutable.Seq<AccumulableInfo> infos) {
    for (AccumulableInfo info : CollectionConverters.asJava(infos)) {
      Option<Object> update = info.update();
      if (info.id() == accumulatorId && update.isDefined() && update.get() instanceof Map<?, ?>) {
        return copyOf((Map<?, ?>) update.get());
      }
    }
    return null;
  }

  private static Map<String, long[]> copyOf(Map<?, ?> raw) {
    HashMap<String, long[]> out = new HashMap<>();
    raw.forEach(
        (topic, n) -> {
          if (topic instanceof String name && n instanceof long[] kept) {
            out.put(name, kept.clone());
          }
        });
    return out;
  }

  private static void add(Map<String, long[]> into, Map<String, long[]> counts) {
    counts.forEach(
        (topic, n) -> {
          long[] mine = into.computeIfAbsent(topic, t -> new long[2]);
          mine[0] += n[0];
          mine[1] += n[1];
        });
  }
}
