"""Setu's state: the SQL metadata store and the Redis group-state store."""
