"""The ingest job: de-duplicate by producer sequence and write the main log in order."""
