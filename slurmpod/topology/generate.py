"""Site -> every topology artefact Slurm and NCCL need, as {path: text}; written atomically.

Artefacts (docs/admin-guide.md maps each to its Slurm/NCCL setting):

=========================  =====================================================================
topology.conf              topology/tree: one logical leaf per SU (racks when not rail-optimised)
topology-block.conf        topology/block (target Slurm >= 23.11); install as topology.conf
topology.yaml              target Slurm >= 25.05: both topologies, default = site.topology_plugin
gres.conf                  Name=gpu Type=<model> File=/dev/nvidia[..] Cores=<NUMA-local cores>
nodes.conf                 NodeName + PartitionName lines, to `Include` from slurm.conf
rails.csv                  node, GPU, HCA, rail, leaf switch, leaf port
cabling.csv                every expected cable (node HCA -> leaf, leaf -> spine, spine -> core)
nccl-topo/<type>.xml       NCCL_TOPO_FILE per node type
imex/<domain>/             nodes_config.cfg of nvidia-imex for the nodes of one NVLink domain
                           (rack-scale NVLink sites with IMEX on: GB200/GB300 NVL72)
=========================  =====================================================================

Which of topology.conf / topology-block.conf Slurm should read follows `Site.topology_plugin`
(`slurm.topology`, "auto" = block for NVL72-class sites when the target is >= 23.11): see
`topology_file_to_install`. Generation is pure; only `write_artifacts` touches the disk.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slurmpod.errors import ConfigError, UsageError
from slurmpod.model.site import BLOCK_MIN
from slurmpod.topology.layout import block_layout, tree_switches

if TYPE_CHECKING:
    from slurmpod.model.site import Site

_VERSION = re.compile(r"^(\d{2})\.(\d{2})(\.\d+)?$")
YAML_MIN = (25, 5)  # topology.yaml appeared in Slurm 25.05
IMEX_MIN = (24, 5)  # SwitchType=switch/nvidia_imex appeared in Slurm 24.05 (NEWS, 24.05.0)


@dataclass(frozen=True)
class GenerateOptions:
    """Overrides for one generation run (the sandbox uses the first three).

    slurm_version: target this Slurm instead of `slurm.version` (e.g. the installed "22.05").
    gres_file_prefix: replaces every node type's `gpu_device_path` in gres.conf File=.
    localhost_base_port: every NodeName line also gets NodeHostname=localhost
        NodeAddr=127.0.0.1 Port=[a-b], node i (0-based, inventory order) on port base + i.
    imex_hosts: host name -> IP address (from a hosts(5) file, `read_hosts_file`): the IMEX
        nodes_config.cfg files list these addresses instead of host names.
    """

    slurm_version: str | None = None
    gres_file_prefix: str | None = None
    localhost_base_port: int | None = None
    imex_hosts: Mapping[str, str] | None = None


def parse_version(text: str, what: str = "--slurm-version") -> tuple[int, int]:
    m = _VERSION.match(text.strip())
    if not m:
        raise UsageError(f"{what}: {text!r} is not a Slurm release; use YY.MM, e.g. 24.11")
    return int(m.group(1)), int(m.group(2))


def target_version(site: Site, options: GenerateOptions | None) -> tuple[int, int]:
    if options and options.slurm_version:
        return parse_version(options.slurm_version)
    return site.slurm.version_tuple


def topology_plugin(site: Site, version: tuple[int, int]) -> str:
    """`Site.topology_plugin`, re-evaluated for an overridden target version."""
    if site.slurm.topology == "block" and version < BLOCK_MIN:
        raise ConfigError(
            f"topology/block needs Slurm >= 23.11 but the target is {version[0]}.{version[1]:02d}",
            key="slurm.topology", hint="set slurm.topology = 'tree' or target a newer Slurm",
        )
    return site.topology_plugin_for(version)


def imex_enabled(site: Site, version: tuple[int, int]) -> bool:
    """Whether Slurm hands out IMEX channels (switch/nvidia_imex) on this site.

    IMEX (the nvidia-imex daemon plus a per-job channel device) is what lets CUDA share GPU
    memory between nodes of one multi-node NVLink domain (GB200/GB300 NVL72); 8-GPU nodes whose
    NVLink ends at the node never need it. "auto" = on for such sites when the target has it.
    """
    nvl = site.rack_scale_nvlink
    if site.slurm.imex == "auto":
        return nvl and version >= IMEX_MIN
    if site.slurm.imex and version < IMEX_MIN:
        raise ConfigError(
            f"switch/nvidia_imex needs Slurm >= 24.05 but the target is "
            f"{version[0]}.{version[1]:02d}",
            key="slurm.imex", hint="set slurm.imex = false or target a newer Slurm",
        )
    return bool(site.slurm.imex)


def topology_file_to_install(site: Site, options: GenerateOptions | None = None) -> str:
    """The generated file that becomes /etc/slurm/topology.conf (or topology.yaml on >= 25.05)."""
    version = target_version(site, options)
    if version >= YAML_MIN:
        return "topology.yaml"
    return "topology-block.conf" if topology_plugin(site, version) == "block" else "topology.conf"


def generation_warnings(site: Site, options: GenerateOptions | None = None) -> list[str]:
    """Things that are legal but probably not what the admin wants."""
    out = []
    for type_name, weight in sorted(site.slurm.node_weights.items()):
        out.append(
            f"slurm.node_weights sets Weight={weight} on node type {type_name!r}: Slurm picks "
            "lower-weight nodes first, which overrides topology-aware placement "
            "(topology/tree and topology/block); remove the weights unless that is intended"
        )
    used = {g.node_type for g in site.su_groups}
    for type_name in sorted(set(site.node_types) - used):
        out.append(f"node_types.{type_name} is not used by any su_groups entry; no files for it")
    version = target_version(site, options)
    if imex_enabled(site, version) and site.rack_scale_nvlink:
        hosts = options.imex_hosts if options else None
        missing = [n.name for n in site.inventory.nodes if not hosts or n.name not in hosts]
        if missing:
            out.append(
                f"imex/*/nodes_config.cfg list host names for {len(missing)} node(s) without an "
                f"address (first {missing[0]}): nvidia-imex is documented to read IP addresses "
                "(IMEX guide, IMEX_NODE_CONFIG_FILE); pass --imex-hosts FILE (hosts(5) format)"
            )
    return out


def read_hosts_file(path: str, text: str) -> dict[str, str]:
    """Host name (and alias) -> address from hosts(5) text: `ADDRESS NAME [ALIAS...]`, `#` comments.

    The first address given for a name wins, as in glibc's files backend."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            ipaddress.ip_address(fields[0])
        except ValueError:
            raise UsageError(f"--imex-hosts {path}:{lineno}: {fields[0]!r} is not an IP address; "
                             "expected hosts(5) lines 'ADDRESS NAME [ALIAS...]'") from None
        if len(fields) < 2:
            raise UsageError(f"--imex-hosts {path}:{lineno}: address {fields[0]} names no host")
        for name in fields[1:]:
            out.setdefault(name, fields[0])
            out.setdefault(name.split(".", 1)[0], fields[0])  # FQDN: its short name too
    return out


def _check_options(site: Site, options: GenerateOptions) -> None:
    base = options.localhost_base_port
    if base is not None:
        last = base + len(site.inventory.nodes) - 1
        if base < 1 or last > 65535:
            raise UsageError(
                f"localhost_base_port: ports {base}..{last} do not fit in 1..65535; "
                "choose a lower base port"
            )
    prefix = options.gres_file_prefix
    if prefix is not None and (not prefix.startswith("/") or re.search(r"[\s\[\],=#]", prefix)):
        raise UsageError(
            f"gres_file_prefix: {prefix!r} must be an absolute path without spaces, brackets, "
            "commas, '=' or '#'"
        )


def generate(site: Site, options: GenerateOptions | None = None) -> dict[str, str]:
    """Every artefact of `site` as {relative path: text}. Pure: nothing is written."""
    from slurmpod.render.env import header, make_env  # lazy: start-up
    from slurmpod.topology import node_files, slurm_files  # lazy: start-up
    from slurmpod.topology.fabric_plan import plan_fabric  # lazy: start-up

    options = options or GenerateOptions()
    _check_options(site, options)
    version = target_version(site, options)
    plugin = topology_plugin(site, version)
    ctx = slurm_files.SlurmContext(
        version=version, plugin=plugin, gres_file_prefix=options.gres_file_prefix,
        localhost_base_port=options.localhost_base_port, imex=imex_enabled(site, version),
    )
    name = site.site.name
    env = make_env()
    try:
        plan = plan_fabric(site)
        switches = tree_switches(site, plan)
        layout = block_layout(site, version) if version >= BLOCK_MIN else None
    except ValueError as exc:
        head, sep, rest = str(exc).partition(": ")
        raise ConfigError(rest if sep else str(exc), key=head if sep else None) from None

    def hdr(template: str, comment: str = "#") -> str:
        return header(comment, template, name)

    files: dict[str, str] = {
        "topology.conf": slurm_files.topology_conf(
            env, hdr("topology/topology.conf.j2"), site, switches),
    }
    if layout is not None:
        files["topology-block.conf"] = slurm_files.topology_block_conf(
            env, hdr("topology/topology-block.conf.j2"), site, layout)
        if version >= YAML_MIN:
            files["topology.yaml"] = slurm_files.topology_yaml(
                env, hdr("topology/topology.yaml.j2"), ctx, switches, layout)
    files["gres.conf"] = slurm_files.gres_conf(env, hdr("topology/gres.conf.j2"), site, ctx)
    files["nodes.conf"] = slurm_files.nodes_conf(
        env, hdr("topology/nodes.conf.j2"), site, ctx, layout, generation_warnings(site, options))
    files["rails.csv"] = node_files.rails_csv(hdr("builtin rails.csv"), site, plan)
    files["cabling.csv"] = node_files.cabling_csv(hdr("builtin cabling.csv"), plan)
    used = sorted({g.node_type for g in site.su_groups})
    for type_name in (t for t in used if site.node_types[t].nccl_topo_file):
        files[f"nccl-topo/{type_name}.xml"] = node_files.nccl_topology_xml(
            env, hdr("topology/nccl-topo.xml.j2", comment=""), site, type_name)
    if ctx.imex and site.rack_scale_nvlink:
        # No header: the IMEX guide documents this file as addresses only, one per line.
        files.update(node_files.imex_nodes_configs(site, options.imex_hosts))
    return files


def write_artifacts(site: Site, out_dir: Path | str,
                    options: GenerateOptions | None = None) -> list[Path]:
    """Generate everything first, then write all files atomically (nothing on error)."""
    from slurmpod.fsutil import write_tree_atomic  # lazy: start-up

    files = generate(site, options)
    return write_tree_atomic(Path(out_dir), files)
