"""The GPU catalog: the figures a site file may leave out when it names a known GPU.

One entry per `gpu.model` (the gres Type). Peaks are *dense* tensor-core figures per GPU: NVIDIA's
data sheets print the 2:4-sparsity figure first (marked "with sparsity"); dense is half of it.
HBM capacity is what the driver reports as usable (GiB, the figure plan's memory check divides),
bandwidth is the data sheet's. NVLink bandwidth is per GPU and per direction (the data sheets
give the bidirectional total: 600 GB/s on A100, 900 GB/s on H100/H200, 1.8 TB/s on Blackwell).
The host figures are those of the reference system (DGX A100/H100/H200/B200/B300, GB200/GB300
NVL72), per GPU: its link to host memory, one direction (PCIe x16, or its share of Grace's
NVLink-C2C), and its share of the host's memory bandwidth (all sockets' channels over the node's
GPUs); they time activation and optimizer offload.

A site's `gpu = { model = "h100" }` takes every figure from here; keys it sets override
(`slurmpod.model.site.Gpu`). Pure data, no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

# The host of a GPU the catalog does not hold: PCIe Gen5 x16, and the DGX H100's memory per GPU.
PCIE_GEN5_X16_GB_S = 64.0
DGX_H100_HOST_MEMORY_GB_S = 76.8


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    name: str
    peak_tflops_bf16: float  # dense BF16/FP16 tensor core, TFLOP/s
    peak_tflops_fp8: float | None  # dense FP8 tensor core; None: no FP8 tensor cores
    hbm_gib: float  # usable HBM per GPU
    hbm_tb_per_s: float  # HBM bandwidth
    nvlink_gb_per_s: float  # NVLink per GPU, one direction
    nvlink_domain_gpus: int  # GPUs one NVLink switch domain joins in the reference system
    generation: str  # for calibration: one set of fitted factors per generation
    source: str
    host_link_gb_per_s: float = PCIE_GEN5_X16_GB_S  # GPU to host memory, one direction
    host_memory_gb_per_s: float = DGX_H100_HOST_MEMORY_GB_S  # host memory bandwidth per GPU


CATALOG: dict[str, GpuSpec] = {
    g.model: g for g in (
        GpuSpec("a100", "A100 SXM4 80GB", 312.0, None, 80.0, 2.039, 300.0, 8, "ampere",
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (BF16 312 TFLOPS dense, "
                "80GB HBM2e 2,039 GB/s, NVLink 600 GB/s, PCIe Gen4 64 GB/s); DGX A100: 2 AMD EPYC "
                "7742, 8 channels DDR4-3200 each (2 x 204.8 GB/s over 8 GPUs)",
                host_link_gb_per_s=32.0, host_memory_gb_per_s=51.2),
        GpuSpec("h100", "H100 SXM5 80GB", 989.0, 1979.0, 80.0, 3.35, 450.0, 8, "hopper",
                "https://www.nvidia.com/en-us/data-center/h100/ (BF16 1,979 / FP8 3,958 TFLOPS "
                "with sparsity; 80GB 3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s); DGX H100: 2 "
                "Xeon Platinum 8480C, 8 channels DDR5-4800 each (2 x 307.2 GB/s over 8 GPUs)",
                host_link_gb_per_s=64.0, host_memory_gb_per_s=76.8),
        GpuSpec("h200", "H200 SXM 141GB", 989.0, 1979.0, 140.0, 4.8, 450.0, 8, "hopper",
                "https://www.nvidia.com/en-us/data-center/h200/ (H100 compute; 141GB HBM3e "
                "4.8 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s); DGX H200: the DGX H100 host",
                host_link_gb_per_s=64.0, host_memory_gb_per_s=76.8),
        GpuSpec("b200", "B200 180GB (HGX/DGX B200)", 2250.0, 4500.0, 180.0, 8.0, 900.0, 8,
                "blackwell",
                "https://www.nvidia.com/en-us/data-center/dgx-b200/ (72 PFLOPS FP8 training per "
                "8 GPUs with sparsity; 1,440 GB HBM3e, 64 TB/s per 8 GPUs; NVLink 5 1.8 TB/s; 2 "
                "Xeon Platinum 8570, 8 channels DDR5-5600 each: 2 x 358.4 GB/s over 8 GPUs); "
                "B200 on PCIe Gen5 x16 (64 GB/s each way)",
                host_link_gb_per_s=64.0, host_memory_gb_per_s=89.6),
        GpuSpec("gb200", "B200 in GB200 NVL72", 2500.0, 5000.0, 186.0, 8.0, 900.0, 72,
                "blackwell",
                "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (per 72 GPUs: BF16 360 / "
                "FP8 720 PFLOPS with sparsity, 13.4 TB HBM3e at 576 TB/s, NVLink 130 TB/s; "
                "17 TB LPDDR5X at 18.4 TB/s over 36 Grace CPUs; NVLink-C2C 900 GB/s both ways "
                "per Grace, shared by its two GPUs: 225 GB/s each way per GPU)",
                host_link_gb_per_s=225.0, host_memory_gb_per_s=255.6),
        # Blackwell Ultra: the dense BF16/FP8 tensor-core figures of B200 (HGX) and GB200 (NVL72);
        # 288 GB of HBM3e (12-high stacks) at 8 TB/s; the same NVLink 5. Fitted factors: the
        # HGX B300 (1,100 W) runs Megatron-Bridge's presets as B200 does per peak (its seven rows
        # within 10 % on Blackwell's factors, up to 19 % fast on GB300's), the 1,400 W GB300 faster
        # than GB200 (1.2x at the same peaks): GB300 has factors of its own.
        GpuSpec("b300", "B300 288GB (HGX/DGX B300, Blackwell Ultra)", 2250.0, 4500.0, 288.0, 8.0,
                900.0, 8, "blackwell",
                "https://www.nvidia.com/en-us/data-center/dgx-b300/ (72 PFLOPS FP8 training per "
                "8 GPUs with sparsity; 2.3 TB HBM3e; NVLink 5 1.8 TB/s; 8 ConnectX-8 800 Gb/s; 2 "
                "Xeon 6776P, 8 channels DDR5-6400 each: 2 x 409.6 GB/s over 8 GPUs); the Xeon's "
                "PCIe Gen5 x16 (64 GB/s each way)",
                host_link_gb_per_s=64.0, host_memory_gb_per_s=102.4),
        GpuSpec("gb300", "B300 in GB300 NVL72 (Blackwell Ultra)", 2500.0, 5000.0, 288.0, 8.0, 900.0,
                72, "gb300",
                "https://www.nvidia.com/en-us/data-center/gb300-nvl72/ (per 72 GPUs: BF16 360 / "
                "FP8 720 PFLOPS with sparsity, up to 21 TB HBM3e at 576 TB/s, NVLink 130 TB/s; "
                "up to 18 TB LPDDR5X at 14.3 TB/s over 36 Grace CPUs; NVLink-C2C 900 GB/s both "
                "ways per Grace, shared by its two GPUs: 225 GB/s each way per GPU)",
                host_link_gb_per_s=225.0, host_memory_gb_per_s=198.6),
        # The sandbox's CPU stand-in: `slurmpod sandbox up` measures its peak and writes it into
        # the site; these are placeholders for a site that names it without measuring.
        GpuSpec("emu", "emulated GPU (CPU matmul)", 0.05, None, 80.0, 0.02, 1.0, 8, "emulated",
                "slurmpod sandbox: measured at `sandbox up` (docs/sandbox.md)",
                host_link_gb_per_s=1.0, host_memory_gb_per_s=1.0),
    )
}


def lookup(model: str) -> GpuSpec | None:
    """The catalog entry of a gres Type (case-insensitive), or None."""
    return CATALOG.get(model.lower())
