"""Setu's shared core: names, headers, the message envelope, settings and errors.

This package imports nothing else of Setu's; every other package may import it.
"""
