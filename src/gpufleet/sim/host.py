"""Simulated host facts, shaped like the real H200 machine in tests/fixtures/h200 (os-release, uname, meminfo).

A real 8-GPU HGX H200 node has far more cores and memory than that one-GPU VM, so the simulated
node scales CPU and memory per GPU from it (16 cores and 126 GiB per GPU).
"""

from __future__ import annotations

from gpufleet.agent.host import HostFacts

OS_NAME = "Ubuntu 24.04.3 LTS"  # h200/os-release.txt
KERNEL = "6.18.44-fc-v657-gpu"  # h200/uname.txt
CPU_MODEL = "Intel(R) Xeon(R) Platinum 8480+"
CPUS_PER_GPU = 16  # h200/nproc.txt
MEMORY_MIB_PER_GPU = 131981020 // 1024  # h200/meminfo.txt MemTotal


def simulated_host(name: str, gpu_count: int) -> HostFacts:
    scale = max(gpu_count, 1)
    return HostFacts(
        hostname=name,
        cpus=CPUS_PER_GPU * scale,
        cpu_model=CPU_MODEL,
        memory_total_mib=MEMORY_MIB_PER_GPU * scale,
        os_name=OS_NAME,
        kernel=KERNEL,
        arch="x86_64",
    )
