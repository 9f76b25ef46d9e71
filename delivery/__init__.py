"""Delivery workers: per-group ordered webhook dispatch, retry tiers and dead letters."""
