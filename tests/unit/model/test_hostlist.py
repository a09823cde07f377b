"""Hostlist compress/expand: table cases checked against scontrol 22.05 output, plus round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmpod.model.hostlist import HostlistError, compress, expand

# (hosts, what `scontrol show hostlist` printed on Slurm 22.05.8)
SCONTROL_CASES = [
    (["a1", "b2", "a2"], "a1,b2,a2"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n09", "n10"], "n[09-10]"),
    (["n9", "n010"], "n[9,010]"),
    (["n1", "n1"], "n[1,1]"),
    (["x", "y1"], "x,y1"),
    (["n1", "n2", "m1", "n3"], "n[1-2],m1,n3"),
    (["n2", "n1"], "n[2,1]"),
    ([f"dgx{i:04d}" for i in (1, 2, 3, 5, 6)], "dgx[0001-0003,0005-0006]"),
]


@pytest.mark.parametrize(("hosts", "expected"), SCONTROL_CASES)
def test_compress_matches_scontrol(hosts, expected):
    assert compress(hosts) == expected


@pytest.mark.parametrize(("hosts", "expected"), SCONTROL_CASES)
def test_expand_inverts_scontrol(hosts, expected):
    assert expand(expected) == hosts


def test_expand_cartesian():
    assert expand("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[3-1]", "n[a-b]", "n[[1]]", "n[1,]"])
def test_expand_rejects_garbage(bad):
    with pytest.raises(HostlistError):
        expand(bad)


names = st.builds(
    lambda p, n, w: f"{p}{n:0{w}d}",
    st.sampled_from(["dgx", "gpu", "n", "r1n"]),
    st.integers(0, 2000),
    st.integers(1, 5),
)


@given(st.lists(names, max_size=60))
def test_round_trip(hosts):
    assert expand(compress(hosts)) == hosts
