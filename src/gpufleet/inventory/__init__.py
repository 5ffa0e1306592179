"""Nodes and GPUs: lifecycle, the node state machine, inventory and liveness."""
