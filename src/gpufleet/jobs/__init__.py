"""Jobs: the workload manager behind a protocol (the built-in one for now; Slurm in a later issue)."""
