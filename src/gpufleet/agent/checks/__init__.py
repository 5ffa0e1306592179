"""Node-side health checks: custom executables in the NHC style, required services and required mounts.

`runner.HostChecks` runs them all, a bounded number at a time, and the daemon attaches the latest
results to every sample (`Sample.checks`); the head turns them into verdicts.
"""
