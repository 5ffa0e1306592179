"""gpufleet: an open-source GPU cluster manager."""

__version__ = "0.1.0"
