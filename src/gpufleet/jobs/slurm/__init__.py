"""Slurm as the workload manager: its programs run with argument lists (`commands`), its node states
parsed (`nodes`), and `SlurmWorkloadManager` (`manager`), the `WorkloadManager` over them."""
