"""Kernel and driver logs: the Xid table and policy, the pure classifier (run by agents and the CLI)."""
