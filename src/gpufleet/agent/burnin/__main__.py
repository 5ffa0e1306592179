"""`python -m gpufleet.agent.burnin`: the same as the gpufleet-burnin console script."""

import sys

from gpufleet.agent.burnin.main import main

# The guard matters: the all-reduce spawns processes that import this module again.
if __name__ == "__main__":
    sys.exit(main())
