"""Head-node background loops: heartbeat flush (every replica) and the leader-only liveness sweep."""
