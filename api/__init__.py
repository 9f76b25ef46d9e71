"""The HTTP API: control plane, produce, and the operator views of delivery."""
