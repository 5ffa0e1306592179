"""What a healthy simulated node measures in each burn-in step: per GPU model (GPU_FIGURES, derived from the
H200 capture, datasheets and published runs, each figure with its source) and for the host (HOST_FIGURES,
measured on the build machine). `sim.burnin` moves them by jitter and the node's faults.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.sim.nvml import LOAD_TEMP_C


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """What one healthy GPU of a model measures in each GPU step, and the node's network figures."""

    gemm_tflops: float  # dense BF16 (and FP16) matrix multiply, sustained
    memory_gbs: float  # device-to-device copy
    host_copy_gbs: float  # pinned host to device and back, the slower direction
    peer_gbs: float  # copy to another GPU of the board, one direction
    thermal_c: float  # under sustained full load
    allreduce_gbs: float  # NCCL bus bandwidth between two such nodes
    network_gbits: float  # ib_write_bw to the partner over one port


# Derived figures use these shares of a peak; each is stated where it is used.
_COPY_SHARE = 0.90  # a device copy sustains ~90% of HBM peak (STREAM-like copies on HBM2e and HBM3)
_PCIE_SHARE = 0.85  # pinned copies keep ~85% of the raw link after TLP headers and flow-control packets
_NVLINK_SHARE = 0.83  # a peer copy sustains ~83% of the links' rate one way (p2p tests on HGX boards)
_IB_SHARE = 0.96  # ib_write_bw reaches ~96% of the port's signalling rate (headers take the rest)
_NCCL_SHARE = 0.92  # two-node all-reduce bus bandwidth approaches the inter-node port's rate
_PCIE_GBS_PER_LANE = {4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}  # GT/s x 128b/130b encoding / 8 bits
_NVLINK_GBS_PER_LINK = 25.0  # NVLink 3 and 4: 50 GB/s per link both ways together


def _hopper_gemm_tflops() -> float:
    # 132 SMs x 4 tensor cores x 1,024 dense BF16 FLOP a clock (Hopper whitepaper: 989.4 TFLOPS at 1,830 MHz)
    # at the probe's SM clock under a bf16 matmul held at the 700 W cap (nvml-probe.json series: median
    # 1,470 MHz) = 795 TFLOPS; a sustained cuBLAS burn keeps about 90% of it. (Best-shape runs on H100 SXM
    # reach 792 TFLOPS at boost clocks, for seconds: the MAMF finder's published table.)
    return round(132 * 4 * 1024 * 1.470e9 * 0.90 / 1e12, 1)


GPU_FIGURES: dict[str, GpuFigures] = {
    "H200": GpuFigures(
        gemm_tflops=_hopper_gemm_tflops(),  # 715.3
        # HBM3e peak from the capture: 6,016-bit bus (nvmlDeviceGetMemoryBusWidth) x 3,201 MHz (maxclock_mem)
        # x 2 (double data rate) / 8 = 4,813 GB/s (NVIDIA's datasheet: 4.8 TB/s).
        memory_gbs=round(6016 * 3201e6 * 2 / 8 / 1e9 * _COPY_SHARE),  # 4,333
        # PCIe Gen5 x16 (nvml-probe.json: current link generation 5, width 16) = 63.0 GB/s each way.
        host_copy_gbs=round(16 * _PCIE_GBS_PER_LANE[5] * _PCIE_SHARE, 1),  # 53.6
        # 18 NVLink 4 links (sim.nvml MODELS; the probed VM has one GPU and no NVLink, nvidia-smi-topo.txt).
        peer_gbs=round(18 * _NVLINK_GBS_PER_LINK * _NVLINK_SHARE),  # 374
        # The probe's bf16 matmul held 64-66 C at 692 W (nvml-probe.json series), the level sim.nvml
        # reports under load, so a step's figure agrees with the node's telemetry.
        thermal_c=LOAD_TEMP_C,
        # One 400 Gbit/s NDR port between the two nodes (the simulated ports' rate): 50 GB/s.
        allreduce_gbs=round(400 / 8 * _NCCL_SHARE, 1),  # 46.0
        network_gbits=round(400 * _IB_SHARE),  # 384
    ),
    "H100": GpuFigures(
        gemm_tflops=_hopper_gemm_tflops(),  # the same GH100 compute at the same 700 W cap as the H200
        memory_gbs=round(3352 * _COPY_SHARE),  # H100 SXM5 80 GB datasheet: 3.35 TB/s HBM3; 3,017
        host_copy_gbs=round(16 * _PCIE_GBS_PER_LANE[5] * _PCIE_SHARE, 1),  # PCIe Gen5 x16 (sim.nvml MODELS)
        peer_gbs=round(18 * _NVLINK_GBS_PER_LINK * _NVLINK_SHARE),  # 18 NVLink 4 links, as the H200
        thermal_c=LOAD_TEMP_C,  # no capture; sim.nvml gives every model the probe's load level
        allreduce_gbs=round(400 / 8 * _NCCL_SHARE, 1),  # NDR 400, as the H200
        network_gbits=round(400 * _IB_SHARE),
    ),
    "A100": GpuFigures(
        # The MAMF finder's best shape on A100 SXM reaches 267.9 TFLOPS of the 312 peak; a fixed-shape
        # sustained burn stays a little under it.
        gemm_tflops=260.0,
        memory_gbs=round(2039 * _COPY_SHARE),  # A100 SXM4 80 GB datasheet: 2,039 GB/s HBM2e; 1,835
        host_copy_gbs=round(16 * _PCIE_GBS_PER_LANE[4] * _PCIE_SHARE, 1),  # PCIe Gen4 x16: 26.8
        peer_gbs=round(12 * _NVLINK_GBS_PER_LINK * _NVLINK_SHARE),  # 12 NVLink 3 links: 249
        thermal_c=LOAD_TEMP_C,
        # HGX A100 boards shipped with 200 Gbit/s HDR adapters (the profiles' thresholds assume so), though
        # the simulated ports read NDR for every model.
        allreduce_gbs=round(200 / 8 * _NCCL_SHARE, 1),  # 23.0
        network_gbits=round(200 * _IB_SHARE),  # 192
    ),
}


@dataclass(frozen=True, slots=True)
class HostFigures:
    """What every node measures in the host steps, and a CPU-only node over TCP and gloo."""

    cpu_ops_per_cpu: float  # stress-ng --cpu, bogo operations per second per worker (one worker per CPU)
    vm_ops_per_cpu: float  # stress-ng --vm --verify, per worker
    disk_mbs: float  # fio sequential write and read, the slower
    tcp_gbits: float  # a CPU-only node's network step over TCP
    gloo_gbs: float  # a CPU-only node's all-reduce over gloo


HOST_FIGURES = HostFigures(
    # Measured on the build machine (AMD EPYC, stress-ng 0.15.06): `stress-ng --cpu 1 --timeout 5
    # --metrics-brief` gave 2,213.8 bogo ops/s; `--vm 1 --vm-bytes 256M --verify` gave 62,023.
    cpu_ops_per_cpu=2214.0,
    vm_ops_per_cpu=62023.0,
    # Measured on the build machine's virtio disk (fio 3.33, 512 MiB in 1 MiB blocks, direct, libaio at
    # depth 16): write 1,966 MB/s, read 1,538 MB/s; the step reports the slower.
    disk_mbs=1538.0,
    # A 25 GbE NIC: TCP at 1,500 MTU carries 1,448 of every 1,538 bytes on the wire (94%).
    tcp_gbits=round(25 * 1448 / 1538, 1),  # 23.5
    # An estimate, not a measurement: a two-rank ring all-reduce moves each byte once each way, near the
    # TCP rate (2.9 GB/s), less gloo's overhead (~20%). No built-in profile has a threshold for it.
    gloo_gbs=2.3,
)
