package setu.ingest;

/**
 * The fields of one ingest record that the de-duplication reads.
 *
 * @param producer the producer id, or null
 * @param sequence the producer sequence (read only with a producer id)
 * @param incarnation the topic incarnation the API stamped (0 when none)
 * @param recordMs the record's Kafka timestamp
 * @param messageId the message id, or null
 * @param windowMs the topic's message id window (0: off; read only without a producer id)
 */
public record Incoming(
    String producer,
    long sequence,
    long incarnation,
    long recordMs,
    String messageId,
    long windowMs) {}
