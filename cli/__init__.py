"""The `setu` command: the composition root that wires settings to every process."""
