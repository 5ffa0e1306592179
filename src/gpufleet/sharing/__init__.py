"""GPU sharing between jobs: MIG layouts declared, reconciled through the agents, and scheduled (docs/sharing.md)."""
