"""Cluster presets, custom cluster files and their validation (ballast/cluster.py)."""
from __future__ import annotations

import json
import re

import pytest

from ballast.vocabulary.cluster import default_cluster, PRESETS, Cluster, get_cluster

GB = 1e9
# FlexSP's measured all-to-all bandwidth on 64 A100-40GB, GB/s by SP degree (docs/design.md).
FLEXSP_BW_GBS = {2: 119.5, 4: 104.1, 8: 96.5, 16: 10.3, 32: 5.9, 64: 4.9}


# --- presets ---------------------------------------------------------------------------------
def test_a100_64_is_flexsp_cluster():
    c = get_cluster("a100-64")
    assert (c.nodes, c.devices_per_node, c.world_size) == (8, 8, 64)
    assert c.device_memory == 28 * GB          # FlexSP's usable memory per A100-40GB
    assert c.peak_flops == 312e12              # A100 dense bf16
    assert c.degrees == [1, 2, 4, 8, 16, 32, 64]
    assert c.bandwidth == {d: bw * GB for d, bw in FLEXSP_BW_GBS.items()}


@pytest.mark.parametrize("name, memory_gb", [("h100-32", 68), ("h200-32", 129)])
def test_hopper_presets(name, memory_gb):
    c = get_cluster(name)
    assert (c.nodes, c.devices_per_node, c.world_size) == (4, 8, 32)
    assert c.device_memory == memory_gb * GB
    assert c.peak_flops == 989e12
    assert sorted(c.bandwidth) == [2, 4, 8, 16, 32]
    # Inside a node (NVLink) an all-to-all is several times faster than across nodes (one NIC).
    assert min(c.bandwidth[d] for d in (2, 4, 8)) > 5 * max(c.bandwidth[d] for d in (16, 32))
    # Bandwidth never grows with the degree (more peers share the same links).
    bws = [c.bandwidth[d] for d in sorted(c.bandwidth)]
    assert bws == sorted(bws, reverse=True)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_has_bandwidth_for_every_degree(name):
    c = get_cluster(name)
    assert c.degrees[-1] == c.max_degree <= c.world_size
    assert all(c.bandwidth[d] > 0 for d in c.degrees if d > 1)
    assert c.to_dict()["name"] == name


def test_sized_gpu_presets():
    # a100-N is N A100s in DGX nodes of 8, with FlexSP's bandwidth table where it applies.
    c = get_cluster("a100-16")
    assert (c.nodes, c.devices_per_node, c.device_memory) == (2, 8, 28 * GB)
    assert c.bandwidth == {d: FLEXSP_BW_GBS[d] * GB for d in (2, 4, 8, 16)}
    assert get_cluster("h100-64").bandwidth[64] < get_cluster("h100-64").bandwidth[8]
    for bad in ("a100-12", "a100-0", "h200-3", "h200-6"):
        with pytest.raises(ValueError, match="multiple of 8"):
            get_cluster(bad)
    # A machine of 1, 2 or 4 GPUs is one node of them, its NICs its share of a node's.
    for devices in (1, 2, 4):
        small = get_cluster(f"h100-{devices}")
        assert (small.nodes, small.devices_per_node, small.nics_per_node) == (1, devices, devices)
        assert small.bandwidth == {d: get_cluster("h100-8").bandwidth[d] for d in small.degrees if d > 1}
    assert get_cluster("a800-2").nics_per_node == 1


def test_default_cluster_is_cpu_for_cpu_ranks_and_the_gpus_preset_on_gpus():
    """`train` under NCCL planned for the cpu preset without a word; now the GPU's model names
    the preset, and a GPU without one is an error naming --cluster."""
    assert default_cluster(2, None) == "cpu"
    assert default_cluster(8, "NVIDIA H100 80GB HBM3") == "h100-8"
    assert default_cluster(4, "NVIDIA A100-SXM4-40GB") == "a100-4"
    assert default_cluster(16, "NVIDIA H200") == "h200-16"
    assert get_cluster(default_cluster(2, "NVIDIA A800-SXM4-80GB"), 2).world_size == 2
    for unknown in ("NVIDIA GeForce RTX 4090", "NVIDIA GH200 480GB"):
        with pytest.raises(ValueError, match="--cluster"):
            default_cluster(8, unknown)


def test_cpu_preset_size_and_memory():
    assert get_cluster("cpu").world_size == 2      # documented default
    c = get_cluster("cpu", world_size=8, device_memory_gb=1.5)
    assert (c.nodes, c.devices_per_node, c.world_size) == (1, 8, 8)
    assert c.device_memory == 1.5 * GB
    assert sorted(c.bandwidth) == [2, 4, 8]
    assert c.value_bytes == 4 and c.all_to_all_latency > 0      # gloo ranks training in fp32
    assert get_cluster("a100-64").value_bytes == 2 and get_cluster("a100-64").all_to_all_latency == 0
    with pytest.raises(ValueError, match="power of two"):
        get_cluster("cpu", world_size=6)


# --- custom clusters from files ----------------------------------------------------------------
TOML = """
nodes = 2
devices_per_node = 4
device_memory = 40e9
peak_flops = 1e14
efficiency = 0.4
micro_batch_overhead = 0.001
all_to_all_latency = 2e-5

[bandwidth]
2 = 1e11
4 = 5e10
8 = 5e9
"""


def test_load_toml(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(TOML)
    c = get_cluster(str(path))
    assert c == Cluster("mine", 2, 4, 40e9, 1e14, 0.4, {2: 1e11, 4: 5e10, 8: 5e9}, 0.001, 2e-5)
    assert c.world_size == 8 and c.node_of(5) == 1
    # world_size is checked against the file too
    assert get_cluster(str(path), world_size=8) == c
    with pytest.raises(ValueError, match="world size 4"):
        get_cluster(str(path), world_size=4)


def test_load_json_and_round_trip(tmp_path):
    c = get_cluster("h100-32")
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(c.to_dict()))      # JSON turns the degree keys into strings
    back = Cluster.load(path)
    assert back == c
    assert all(isinstance(d, int) for d in back.bandwidth)


def test_file_name_is_default_name(tmp_path):
    path = tmp_path / "lab.json"
    data = {"nodes": 1, "devices_per_node": 2, "device_memory": 1e9, "peak_flops": 1e12,
            "bandwidth": {"2": 1e9}}
    path.write_text(json.dumps(data))
    assert get_cluster(str(path)).name == "lab"
    path.write_text(json.dumps({**data, "name": "given"}))
    assert get_cluster(str(path)).name == "given"


# --- bad values --------------------------------------------------------------------------------
BASE = dict(name="t", nodes=2, devices_per_node=4, device_memory=1e9, peak_flops=1e12,
            efficiency=0.5, bandwidth={2: 1e10, 4: 1e10, 8: 1e9}, micro_batch_overhead=0.0)


@pytest.mark.parametrize("change, message", [
    ({"nodes": 0}, "nodes must be >= 1, got 0"),
    ({"devices_per_node": 0}, "devices_per_node must be >= 1, got 0"),
    ({"devices_per_node": 6, "bandwidth": {2: 1, 4: 1, 8: 1}}, "devices_per_node must be a power of two, got 6"),
    ({"device_memory": 0}, "device_memory must be > 0"),
    ({"peak_flops": -1}, "peak_flops must be > 0"),
    ({"efficiency": 1.5}, r"efficiency must be in \(0, 1\], got 1.5"),
    ({"efficiency": 0}, r"efficiency must be in \(0, 1\]"),
    ({"micro_batch_overhead": -1e-3}, "micro_batch_overhead must be >= 0"),
    ({"all_to_all_latency": -1e-3}, "all_to_all_latency must be >= 0"),
    ({"value_bytes": 3}, r"value_bytes must be 2 \(bf16\) or 4 \(fp32\), got 3"),
    ({"bandwidth": {2: 1e10, 4: 1e10}}, "no positive all-to-all bandwidth for SP degree 8"),
    ({"bandwidth": {2: 1e10, 4: 0.0, 8: 1e9}}, "no positive all-to-all bandwidth for SP degree 4"),
])
def test_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        Cluster(**{**BASE, **change})


def test_world_size_mismatch_names_both_sizes():
    with pytest.raises(ValueError, match=r"8 x 8 = 64 devices but the job has world size 8"):
        get_cluster("a100-64", world_size=8)


@pytest.mark.parametrize("spec", ["tpu-64", "a100", "a100-x", "cluster.yaml"])
def test_unknown_preset_lists_presets(spec):
    with pytest.raises(ValueError) as info:
        get_cluster(spec)
    message = str(info.value)
    assert repr(spec) in message
    # A user who mistyped a preset must be told which ones exist.
    assert all(p in message for p in PRESETS), message


def test_missing_bandwidth_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML.replace("8 = 5e9\n", ""))
    with pytest.raises(ValueError, match="SP degree 8"):
        get_cluster(str(path))


def test_unknown_field_in_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**BASE, "gpus_per_node": 8, "bandwidth": {}}))
    with pytest.raises(ValueError, match=r"unknown cluster field\(s\) \['gpus_per_node'\]"):
        get_cluster(str(path))


@pytest.mark.parametrize("name, text", [("c.toml", "nodes = = 2\n"), ("c.json", '{"nodes": 2,')])
def test_unparsable_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=f"cluster file .*{name}: cannot parse"):
        get_cluster(str(path))


def test_missing_file():
    with pytest.raises(ValueError, match="does not exist"):
        Cluster.load("/nonexistent/cluster.toml")


def test_missing_field_in_file_is_a_value_error(tmp_path):
    # A custom file without peak_flops must be a ValueError naming the field (the CLI turns
    # ValueErrors into messages; any other exception is a traceback for the user).
    path = tmp_path / "c.toml"
    path.write_text(TOML.replace("peak_flops = 1e14\n", ""))
    with pytest.raises(ValueError, match="peak_flops"):
        get_cluster(str(path))


# TOML and JSON spell a wrong type differently; each must name the field, the file and the type
# (it used to surface as an AttributeError from 2.5.bit_length() or a TypeError from "2" < 1).
@pytest.mark.parametrize("field, toml, value, expected", [
    ("nodes", "nodes = 2.5", 2.5, "nodes must be an integer, got 2.5 \\(float\\)"),
    ("nodes", 'nodes = "2"', "2", "nodes must be an integer, got '2' \\(str\\)"),
    ("nodes", "nodes = true", True, "nodes must be an integer, got True \\(bool\\)"),
    ("device_memory", 'device_memory = "40e9"', "40e9", "device_memory must be a number"),
    ("efficiency", 'efficiency = "0.4"', "0.4", "efficiency must be a number"),
])
@pytest.mark.parametrize("suffix", ["toml", "json"])
def test_wrong_field_type_in_file(tmp_path, suffix, field, toml, value, expected):
    path = tmp_path / f"c.{suffix}"
    if suffix == "toml":
        line = next(x for x in TOML.splitlines() if x.startswith(f"{field} ="))
        path.write_text(TOML.replace(line, toml))
    else:
        path.write_text(json.dumps({**BASE, field: value}))
    with pytest.raises(ValueError, match=f"cluster file {re.escape(str(path))}: .*{expected}"):
        get_cluster(str(path))


@pytest.mark.parametrize("bandwidth", [{"2": "1e10", "4": 1e10, "8": 1e9}, {"two": 1e10, "4": 1e10, "8": 1e9}])
def test_wrong_bandwidth_type_in_file(tmp_path, bandwidth):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**BASE, "bandwidth": bandwidth}))
    with pytest.raises(ValueError, match=f"cluster file {re.escape(str(path))}: .*bandwidth must map SP degrees"):
        get_cluster(str(path))
    with pytest.raises(ValueError, match="bandwidth must be a table"):
        Cluster(**{**BASE, "bandwidth": [1e10]})


def test_device_memory_applies_to_every_cluster_and_profile(tmp_path):
    """--device-memory-gb replaces a GPU preset's, a file's and a profile's memory (it was ignored
    for all but the cpu preset); unset, each keeps its own."""
    from ballast.pricing.cost_sources import get_cost_model
    from ballast.vocabulary.model_shape import get_model_shape

    assert get_cluster("a100-64").device_memory == 28 * GB
    assert get_cluster("a100-64", device_memory_gb=10).device_memory == 10 * GB
    assert get_cluster("h100-16", 16, device_memory_gb=0.5).device_memory == 0.5 * GB
    assert get_cluster("cpu").device_memory == 4 * GB
    path = tmp_path / "two.json"
    path.write_text('{"nodes": 1, "devices_per_node": 2, "device_memory": 4e10, "peak_flops": 1e14, '
                    '"bandwidth": {"2": 1e11}}')
    assert get_cluster(str(path), device_memory_gb=3).device_memory == 3 * GB
    tiny, cpu = get_model_shape("tiny"), get_cluster("cpu", 2, 1.0)
    profile = tmp_path / "profile.json"
    get_cost_model("analytic", tiny, cpu).save(profile)
    assert get_cost_model(str(profile), tiny, get_cluster("cpu", 2)).device_memory == 1 * GB  # its own
    assert get_cost_model(str(profile), tiny, get_cluster("cpu", 2, 2.5), 2.5).device_memory == 2.5 * GB
    assert get_cost_model("auto", get_model_shape("gpt-7b"), get_cluster("a100-64", device_memory_gb=30)
                          ).device_memory == 30 * GB


# --- NIC topology --------------------------------------------------------------------------------
# name: (NICs per node, bytes/s of one NIC each way) as the vendors' specifications give them.
NIC_SPECS = {"a100-64": (8, 25 * GB), "a800-64": (4, 25 * GB), "h100-32": (8, 50 * GB),
             "h800-32": (8, 50 * GB), "h200-32": (8, 50 * GB)}


@pytest.mark.parametrize("name", NIC_SPECS)
def test_gpu_presets_nics_and_their_share_of_the_bandwidth_table(name):
    c = get_cluster(name)
    nics, nic = NIC_SPECS[name]
    assert (c.nics_per_node, c.nic_bandwidth, c.nics) == (nics, nic, c.nodes * nics)
    block = 8 // nics
    assert c.nic_devices == [list(range(i * block, (i + 1) * block)) for i in range(nics)]
    # Across nodes an all-to-all gets FlexSP's fraction of each GPU's share of the node's NICs.
    for d in (16, 32):
        assert c.bandwidth[d] == pytest.approx(FLEXSP_BW_GBS[d] / 25 * nics * nic / 8)


def test_a800_and_h800_presets():
    a800, h800 = get_cluster("a800-64"), get_cluster("h800-32")
    # Both cut NVLink to 400 GB/s bidirectional: 200 GB/s each way at FlexSP's link fractions.
    for c in (a800, h800):
        assert c.bandwidth[8] == pytest.approx(96.5 / 300 * 200 * GB)
        assert c.device_memory == 68 * GB
    assert (a800.nodes, a800.peak_flops, h800.nodes, h800.peak_flops) == (8, 312e12, 4, 989e12)
    # Two A800s per 200 Gb/s NIC: half an A100's bandwidth across nodes.
    assert a800.bandwidth[16] == pytest.approx(get_cluster("a100-64").bandwidth[16] / 2)


def test_nic_queries_on_a800():
    c = get_cluster("a800-16")
    assert [c.nic_of(r) for r in range(16)] == [r // 2 for r in range(16)]
    assert c.nic_ranks(5) == [10, 11] and list(c.node_ranks(1)) == list(range(8, 16))
    assert c.proxies(0) == [0, 2, 4, 6] and c.proxies(3) == [1, 3, 5, 7] and c.proxies(12) == [8, 10, 12, 14]


@pytest.mark.parametrize("spec", ["a800-16", "h100-16", "cpu"])
def test_every_rank_proxies_under_each_nic_of_its_node(spec):
    c = get_cluster(spec, 4, nodes=2) if spec == "cpu" else get_cluster(spec)
    for rank in range(c.world_size):
        proxies = c.proxies(rank)
        node = c.node_of(rank)
        assert [c.nic_of(p) for p in proxies] == [node * c.nics_per_node + i for i in range(c.nics_per_node)]
        assert proxies[c.nic_of(rank) % c.nics_per_node] == rank
        assert all(p in c.node_ranks(node) and rank in c.nic_ranks(c.nic_of(rank)) for p in proxies)


def test_cpu_preset_emulates_two_nodes():
    c = get_cluster("cpu", world_size=4, nodes=2, device_memory_gb=1.0)
    assert (c.nodes, c.devices_per_node, c.world_size, c.nics_per_node) == (2, 2, 4, 2)
    assert c.nic_devices == [[0], [1]] and c.nic_bandwidth == 0.7 * GB
    assert [c.nic_of(r) for r in range(4)] == [0, 1, 2, 3]
    assert [c.proxies(r) for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert sorted(c.bandwidth) == [2, 4] and c.device_memory == 1 * GB
    assert get_cluster("cpu", world_size=4).nodes == 1                    # one node unless asked
    assert get_cluster("cpu", world_size=8, nodes=4).devices_per_node == 2


@pytest.mark.parametrize("spec, world, nodes, message", [
    ("cpu", 4, 3, "cpu cluster: 4 ranks do not form 3 nodes of equal size"),
    ("a100-64", 64, 2, "cluster 'a100-64' has 8 nodes of 8 devices but the job asks for 2 nodes"),
    ("h100-32", None, 8, "cluster 'h100-32' has 4 nodes of 8 devices but the job asks for 8 nodes"),
    ("a100-16", 8, 2, r"cluster 'a100-16' has 2 x 8 = 16 devices but the job has world size 8"),
])
def test_topology_that_does_not_match_the_job(spec, world, nodes, message):
    with pytest.raises(ValueError, match=message):
        get_cluster(spec, world, nodes=nodes)


def to_toml(data: dict) -> str:
    """`Cluster.to_dict()` as TOML: JSON spells TOML's strings, numbers and arrays of integers."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    return "\n".join(lines + ["[bandwidth]"] + [f"{d} = {bw!r}" for d, bw in data["bandwidth"].items()]) + "\n"


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("suffix", ["toml", "json"])
def test_every_preset_round_trips_with_its_topology(tmp_path, name, suffix):
    c = get_cluster(name, 4, nodes=2) if name == "cpu" else get_cluster(name)
    path = tmp_path / f"copy.{suffix}"
    path.write_text(to_toml(c.to_dict()) if suffix == "toml" else json.dumps(c.to_dict()))
    assert get_cluster(str(path)) == c


def test_nic_fields_in_a_file(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(TOML)
    # Unset: one NIC per device, at the rate that gives each device the inter-node bandwidth.
    c = get_cluster(str(path))
    assert (c.nics_per_node, c.nic_devices, c.nic_bandwidth) == (4, [[0], [1], [2], [3]], 5e9)
    # Two NICs: each serves two devices and moves twice as much.
    path.write_text("nics_per_node = 2\n" + TOML)
    c = get_cluster(str(path))
    assert (c.nics_per_node, c.nic_devices, c.nic_bandwidth) == (2, [[0, 1], [2, 3]], 1e10)
    # Listed: NIC 0 serves devices 0 and 2, NIC 1 devices 1 and 3 (the count follows the lists).
    path.write_text("nic_bandwidth = 2.5e10\nnic_devices = [[0, 2], [1, 3]]\n" + TOML)
    c = get_cluster(str(path))
    assert (c.nics_per_node, c.nic_bandwidth) == (2, 2.5e10)
    assert [c.nic_of(r) for r in range(8)] == [0, 1, 0, 1, 2, 3, 2, 3]
    assert c.proxies(2) == [2, 3] and c.proxies(5) == [4, 5] and c.nic_ranks(3) == [5, 7]
    # One node never sends between nodes: no NIC bandwidth needed.
    assert get_cluster("cpu").nic_bandwidth == 0.7 * GB
    assert Cluster(**{**BASE, "nodes": 1, "bandwidth": {2: 1e10, 4: 1e10}}).nic_bandwidth is None


@pytest.mark.parametrize("change, message", [
    ({"nics_per_node": 0}, "nics_per_node must be >= 1, got 0"),
    ({"nics_per_node": 3}, "nics_per_node 3 does not divide devices_per_node 4; give nic_devices"),
    ({"nic_bandwidth": 0.0}, "nic_bandwidth must be > 0 bytes/s, got 0$"),
    ({"nic_bandwidth": -25e9}, r"nic_bandwidth must be > 0 bytes/s, got -2.5e\+10"),
    ({"nic_devices": [[0, 1], [1, 2, 3]]}, "device 1 is served by two NICs, 0 and 1"),
    ({"nic_devices": [[0, 1], [2]]}, r"device 3 has no NIC \(nic_devices serves 3 of the node's 4 devices\)"),
    ({"nic_devices": [[0, 1, 2, 3], []]}, "NIC 1 of nic_devices serves no device"),
    ({"nic_devices": [[0, 1], [2, 4]]}, r"NIC 1 of nic_devices serves device 4, but a node's devices are 0 \.\. 3"),
    ({"nic_devices": [[0, 1], [2, 3]], "nics_per_node": 4}, "nic_devices lists 2 NICs but nics_per_node is 4"),
    ({"nic_devices": [[0, 1], [2, "3"]]}, "nic_devices must list, for each NIC, the local devices"),
    ({"nic_devices": [[0, 1], [2, True]]}, "nic_devices must list, for each NIC, the local devices"),
    ({"nic_devices": "0,1"}, "nic_devices must be a list or none, got '0,1'"),
    ({"nics_per_node": 2.5}, r"nics_per_node must be an integer or none, got 2.5 \(float\)"),
])
def test_bad_topology(change, message):
    with pytest.raises(ValueError, match=message):
        Cluster(**{**BASE, **change})


def test_bad_topology_in_file_names_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("nic_devices = [[0, 1], [2]]\n" + TOML)
    with pytest.raises(ValueError, match=f"cluster file {re.escape(str(path))}: .*device 3 has no NIC"):
        get_cluster(str(path))
