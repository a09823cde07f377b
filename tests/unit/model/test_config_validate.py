"""config.validate: every msgspec ValidationError becomes one line naming the key path (table
keys included, which msgspec itself writes as `[...]`), what was expected and what was given."""

from __future__ import annotations

import copy

import msgspec
import pytest

from slurmpod.config import validate
from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.model.explain import explain
from slurmpod.model.site import Site
from tests.unit.topology.test_support import site_dict


def two_node_types() -> dict:
    """The sandbox site with a second, unused node type after the real one."""
    data = site_dict("sandbox")
    data["node_types"]["spare"] = copy.deepcopy(data["node_types"]["emu8"])
    return data


def error_of(data: dict, model: type = Site) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate(model, data, "site.toml")
    return info.value


def test_a_valid_site_passes() -> None:
    assert validate(Site, two_node_types(), "site.toml").node_types.keys() == {"emu8", "spare"}


def test_table_key_of_the_failing_entry_is_named() -> None:
    data = two_node_types()
    data["node_types"]["spare"]["gpu"]["hbm_gib"] = -1
    err = error_of(data)
    assert err.key == "node_types.spare.gpu.hbm_gib"
    assert err.message.endswith("expected a number > 0.0 (got -1)")


def test_cross_check_inside_a_table_entry_names_entry_and_key() -> None:
    data = two_node_types()
    data["node_types"]["spare"]["numa_nodes"] = 3  # 2 sockets: not a multiple
    err = error_of(data)
    assert err.key == "node_types.spare.numa_nodes"
    assert "must be a multiple of sockets = 2" in err.message
    del data["node_types"]["spare"]["gpu_pci"][0]
    assert error_of(data).key == "node_types.spare"  # "gpu_pci lists 7 GPUs but gpus = 8"


def test_unknown_and_missing_keys_inside_a_table_entry() -> None:
    data = two_node_types()
    data["node_types"]["spare"]["gpu"]["tflops"] = 1
    err = error_of(data)
    assert (err.key, err.message.split(": ", 2)[-1]) == (
        "node_types.spare.gpu.tflops",
        "unknown key; remove it or check its spelling (see docs/admin-guide.md)")
    data = two_node_types()
    del data["node_types"]["spare"]["sockets"]
    err = error_of(data)
    assert err.key == "node_types.spare.sockets" and "required key is missing" in err.message


@pytest.mark.parametrize(("section", "value", "key", "says"), [
    ("fabric", {"kind": "ib"}, "fabric.kind", "must be one of 'infiniband', 'roce' (got 'ib')"),
    ("fabric", {"rails": "eight"}, "fabric.rails", "expected an integer (got 'eight')"),
    ("fabric", {"rails": True}, "fabric.rails", "expected an integer (got True)"),
    ("fabric", {"rails": 17}, "fabric.rails", "expected an integer <= 16 (got 17)"),
    ("slurm", {"version": "24.11.1"}, "slurm.version",
     r"expected a string matching regex '^\d{2}\.\d{2}$' (got '24.11.1')"),
])
def test_field_errors_say_what_is_expected_and_what_was_given(section, value, key, says) -> None:
    data = site_dict("sandbox")
    data[section] = {**data.get(section, {}), **value}
    err = error_of(data)
    assert err.key == key and err.message.endswith(says), err.message


def test_list_index_and_union_member() -> None:
    data = site_dict("sandbox")
    data["partitions"] = [{"name": "a"}, {"name": "b", "sus": [1, "two"]}]
    err = error_of(data)
    assert err.key == "partitions[1].sus[1]" and err.message.endswith("(got 'two')")
    data["partitions"] = [{"name": "b", "sus": "some"}]
    assert error_of(data).message.endswith("(got 'some')")


def test_not_a_table_at_all() -> None:
    err = error_of([1, 2])  # type: ignore[arg-type]
    assert err.key is None and "expected a table" in err.message


def test_run_spec_errors_name_job_and_megatron_keys() -> None:
    with pytest.raises(ConfigError) as info:
        run_from_dict({"job": {"nodes": 0}, "megatron": {}}, "run.toml")
    assert info.value.key == "job.nodes" and info.value.message.endswith(">= 1 (got 0)")
    base = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 8}
    with pytest.raises(ConfigError) as info:
        run_from_dict({"megatron": {**base, "moe_layer_freq": [1, 2]}}, "run.toml")
    assert info.value.key == "megatron.moe_layer_freq"
    with pytest.raises(ConfigError) as info:
        run_from_dict({"megatron": {**base, "recompute_granularity": "some"}}, "run.toml")
    assert info.value.message.endswith("must be one of 'full', 'selective' (got 'some')")


def test_bookkeeping_fields_cannot_be_set_from_the_run_spec() -> None:
    base = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 8}
    with pytest.raises(ConfigError) as info:
        run_from_dict({"job": {"keys_given": []}, "megatron": base}, "run.toml")
    assert info.value.key == "job.keys_given"
    # In [megatron], unknown names are Megatron's business: passed through, not interpreted.
    run = run_from_dict({"megatron": {**base, "keys_given": 1, "passthrough_args": 2}}, "r.toml")
    assert run.megatron.passthrough() == {"keys_given": 1, "passthrough_args": 2}
    assert run.megatron.keys_given == frozenset(base) | {"keys_given", "passthrough_args"}


def test_explain_without_a_path_keeps_the_message() -> None:
    assert explain("Something odd", Site, {}) == ("Something odd", "")
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert({}, Site)
    assert explain(str(info.value), Site, {}) == ("required key is missing; add it", "site")
