"""What the performance model reads from a site: one GPU kind (its peaks and bandwidths from the
catalog, `slurmpod.model.gpus`, or the site's own figures) and the fabric it sits on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmpod.model.gpus import DGX_H100_HOST_MEMORY_GB_S, PCIE_GEN5_X16_GB_S, lookup

if TYPE_CHECKING:
    from slurmpod.model.site import Site


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the model reads from the site: one GPU kind and the fabric."""

    gpu_model: str
    generation: str
    peak_bf16: float  # TFLOP/s, dense
    peak_fp8: float | None
    hbm_tb_s: float
    nvlink_gb_s: float  # per GPU, one direction
    domain_gpus: int
    gpus_per_node: int
    nic_gb_s: float  # per GPU, one direction (rails x link / GPUs per node)
    sharp: bool = False
    oversubscription: float = 1.0
    nodes_per_su: int = 1_000_000
    # Per GPU: its link to host memory, one direction, and its share of the host's memory
    # bandwidth (GB/s; the catalog's reference systems: slurmpod.model.gpus).
    host_link_gb_s: float = PCIE_GEN5_X16_GB_S
    host_memory_gb_s: float = DGX_H100_HOST_MEMORY_GB_S


def hardware_from_site(site: Site, node_type: str | None = None) -> Hardware:
    """The Hardware of `node_type` (default: the first SU group's) on `site`."""

    name = node_type or site.su_groups[0].node_type
    nt = site.node_types[name]
    g = nt.gpu
    spec = lookup(g.model)
    # An uncatalogued GPU: bandwidths in H100 proportion to its peak.
    hbm = g.hbm_tb_per_s or (spec.hbm_tb_per_s if spec else g.peak_tflops_bf16 * 3.35 / 989)
    nvl = g.nvlink_gb_per_s or (spec.nvlink_gb_per_s if spec else g.peak_tflops_bf16 * 450 / 989)
    # ... and its host: PCIe Gen5 x16, the DGX H100's memory per GPU.
    host_link = g.host_link_gb_per_s or PCIE_GEN5_X16_GB_S
    host_mem = g.host_memory_gb_per_s or DGX_H100_HOST_MEMORY_GB_S
    fab = site.fabric
    n_hca = len(nt.compute_hcas) or fab.rails
    nic = fab.link_gbps / 8 * n_hca / nt.gpus
    grp = next(gr for gr in site.su_groups if gr.node_type == name)
    return Hardware(
        gpu_model=g.model, generation=spec.generation if spec else "hopper",
        peak_bf16=g.peak_tflops_bf16, peak_fp8=g.peak_tflops_fp8, hbm_tb_s=hbm, nvlink_gb_s=nvl,
        domain_gpus=nt.domain_gpus, gpus_per_node=nt.gpus, nic_gb_s=nic, sharp=fab.sharp,
        oversubscription=fab.oversubscription, nodes_per_su=grp.nodes_per_su,
        host_link_gb_s=host_link, host_memory_gb_s=host_mem,
    )
