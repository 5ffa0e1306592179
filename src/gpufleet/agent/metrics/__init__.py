"""The agent's metrics: collectors (GPUs through NVML, the host through psutil, InfiniBand ports through
sysfs), the Xid event watcher, the sampler that runs them in isolation, and the outbox that batches
samples and events for the channel."""
