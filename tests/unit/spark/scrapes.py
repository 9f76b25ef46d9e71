"""What a scrape of the ingest job's metrics shows, for the tests of those metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from spark.metrics import IngestMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: IngestMetrics) -> Samples:
    """Every sample of a scrape, by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))
