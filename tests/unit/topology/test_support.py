"""Site builders shared by the topology tests and benchmarks/topology_scale.py (+ their tests)."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import tomli_w

from slurmpod.config import data_dir
from slurmpod.model.site import Site

SITE_DIR = data_dir("site_configs")
EXAMPLE_SITES = sorted(p.stem for p in SITE_DIR.glob("*.toml"))


def site_dict(name: str) -> dict[str, Any]:
    return tomllib.loads((SITE_DIR / f"{name}.toml").read_text())


def build(data: dict[str, Any]) -> Site:
    site = msgspec.convert(data, Site)
    _ = site.inventory
    return site


def variant(name: str, **sections: Any) -> dict[str, Any]:
    """An example site with some top-level sections replaced or merged (dicts merge, lists
    replace)."""
    data = copy.deepcopy(site_dict(name))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def scale_site(nodes: int, su_nodes: int = 32, spine_groups: str = "per_rail") -> Site:
    """A DGX H100 site of `nodes` nodes: full SUs of `su_nodes` plus one partial SU."""
    full, rest = divmod(nodes, su_nodes)
    groups = [{"node_type": "dgx-h100", "sus": full, "nodes_per_su": su_nodes,
               "nodes_per_rack": 4}] if full else []
    if rest:
        # The partial SU: 4-node racks where they fit, else one rack holding the rest.
        groups.append({"node_type": "dgx-h100", "sus": 1, "nodes_per_su": rest,
                       "nodes_per_rack": 4 if rest % 4 == 0 else rest})
    width = max(4, len(str(nodes)))
    data = variant("dgx-h100-superpod", su_groups=groups,
                   naming={"hostname": f"dgx{{n:0{width}d}}"},
                   fabric={"spine_groups": spine_groups}, partitions=[])
    return build(data)


def write(tmp: Path, data: dict[str, Any], name: str = "site.toml") -> Path:
    """Write a site dict as TOML."""
    path = tmp / name
    path.write_text(to_toml(data))
    return path


def to_toml(data: dict[str, Any]) -> str:
    """A site dict as TOML text (tomli-w, as slurmpod writes TOML)."""
    return tomli_w.dumps(data)


def test_scale_site_has_the_requested_size():
    site = scale_site(1000)
    assert len(site.inventory.nodes) == 1000
    assert [g.nodes_per_su for g in site.su_groups] == [32, 8]
