"""Running the head's jobs on this node: the executors (real processes, or simulated) and the supervisor."""
