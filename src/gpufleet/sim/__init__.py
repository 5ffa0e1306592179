"""Simulated hardware, so whole fleets can run on a laptop without a single GPU."""
