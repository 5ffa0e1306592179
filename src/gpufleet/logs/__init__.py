"""Kernel and driver logs: the Xid table and policy and the pure classifier (run by agents and the CLI),
and at the head the stored lines and their search (`models`, `store`)."""
