"""Reading a node's GPU inventory: through NVML, through nvidia-smi, or not at all."""
