"""Log lines of Setu's processes: one format, the level from ``SETU_LOG_LEVEL``."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are per call, not per event.
_QUIET = ("py4j",)


def configure(level: str) -> None:
    """Logs to stderr at ``level`` unless the process set up logging already."""
    if logging.getLogger().handlers:
        return
    logging.basicConfig(level=level.upper(), format=FORMAT)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
