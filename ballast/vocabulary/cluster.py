"""Cluster: the devices a plan runs on, as one validated value object.

A `Cluster` is passed explicitly to planners, the cost model and the runtime; nothing reads
the topology from a global. Besides its devices it knows the NICs of a node: how many, how fast,
which devices each serves (`ballast.pricing.nics` prices a wave's exchange on them). Presets cover the
hardware of the papers ballast compares with; custom clusters load from TOML or JSON with the
same field names.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .nic_devices import fill_nic_devices, proxy
from .value_checks import check_types, from_fields, read_json

GB = 1e9


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster of `nodes` x `devices_per_node` accelerators."""

    name: str
    """Preset or file name, for reports."""
    nodes: int
    """Number of nodes (hosts)."""
    devices_per_node: int
    """Accelerators per node; a power of two, so aligned SP blocks never straddle a node badly."""
    device_memory: float
    """Usable memory per device in bytes (after framework, NCCL and fragmentation reserve)."""
    peak_flops: float
    """Dense bf16 peak FLOP/s of one device."""
    efficiency: float = 0.5
    """Fraction of peak the model's matmuls reach (MFU of linear layers)."""
    bandwidth: dict[int, float] = field(default_factory=dict)
    """Effective all-to-all bandwidth in bytes/s per SP degree: how many bytes of a group's
    all-to-all payload per rank move per second. Fast inside a node, 10-20x slower across."""
    micro_batch_overhead: float = 0.0
    """Fixed seconds per micro-batch (kernel launches, parameter gathers, small collectives)."""
    all_to_all_latency: float = 0.0
    """Seconds one all-to-all call costs beyond moving its bytes, waits for peers included.
    Negligible for NCCL next to a GPU micro-batch; about a millisecond for gloo on a CPU."""
    value_bytes: int = 2
    """Bytes of one activation value as the runtime trains on this device: 2 (bf16) on GPUs,
    4 (fp32) on CPUs."""
    nics_per_node: int | None = None
    """Network cards (NICs) of a node that carry traffic between nodes; unset: one per device
    (as in DGX nodes), or one per list of `nic_devices`."""
    nic_bandwidth: float | None = None
    """Bytes/s one NIC moves in one direction. Unset: the rate at which the node's NICs give each
    device the all-to-all bandwidth of the least inter-node degree, bandwidth[2 x
    devices_per_node] x devices_per_node / nics_per_node (a lower bound: an all-to-all reaches a
    fraction of its links); a one-node cluster never uses its NICs and may leave it unset."""
    nic_devices: list[list[int]] | None = None
    """The local devices (0 .. devices_per_node - 1) each NIC of a node serves, one list per NIC,
    the same on every node; every device under exactly one NIC. Unset: contiguous equal blocks
    (NIC i serves devices i x b .. (i + 1) x b - 1 with b = devices_per_node / nics_per_node)."""
    ring_bandwidth: float | None = None
    """Bytes/s per device that a ring collective over every device moves (NCCL-tests' bus
    bandwidth): the rate of the data-parallel gradient sync and ZeRO-1's parameter all-gather
    (`pricing/whole_step.py`). Unset: across nodes, a device's share of its node's NICs (nics x
    nic_bandwidth / devices_per_node: every ring hop between nodes crosses them, one ring per
    device); inside one node, the all-to-all bandwidth of the whole node (a ring on NVLink gets
    at least that); none on one device."""
    memory_bandwidth: float | None = None
    """Bytes/s of a device's memory: the rate of the optimizer step, which streams the states of
    the parameters a rank updates (`whole_step.OPTIMIZER_BYTES`). Unset: the optimizer step is
    not priced, and `simulate` says so."""

    def __post_init__(self) -> None:
        check_types(self, "cluster", self.name)
        if self.nodes < 1:
            raise ValueError(f"cluster {self.name!r}: nodes must be >= 1, got {self.nodes}")
        if self.devices_per_node < 1:
            raise ValueError(
                f"cluster {self.name!r}: devices_per_node must be >= 1, got {self.devices_per_node}")
        if not is_power_of_two(self.devices_per_node):
            raise ValueError(
                f"cluster {self.name!r}: devices_per_node must be a power of two, "
                f"got {self.devices_per_node}")
        if self.device_memory <= 0:
            raise ValueError(f"cluster {self.name!r}: device_memory must be > 0 bytes")
        if self.peak_flops <= 0:
            raise ValueError(f"cluster {self.name!r}: peak_flops must be > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"cluster {self.name!r}: efficiency must be in (0, 1], got {self.efficiency}")
        if self.micro_batch_overhead < 0:
            raise ValueError(f"cluster {self.name!r}: micro_batch_overhead must be >= 0")
        if self.all_to_all_latency < 0:
            raise ValueError(f"cluster {self.name!r}: all_to_all_latency must be >= 0")
        if self.value_bytes not in (2, 4):
            raise ValueError(f"cluster {self.name!r}: value_bytes must be 2 (bf16) or 4 (fp32), "
                             f"got {self.value_bytes}")
        # JSON/TOML keys arrive as strings (check_types let only digits through).
        bw = {int(d): float(v) for d, v in self.bandwidth.items()}
        object.__setattr__(self, "bandwidth", bw)
        for d in self.degrees:
            if d > 1 and bw.get(d, 0) <= 0:
                raise ValueError(
                    f"cluster {self.name!r}: no positive all-to-all bandwidth for SP degree {d}; "
                    f"give bandwidth for every power of two up to {self.max_degree}")
        self._resolve_nics()
        self._resolve_ring()
        if self.memory_bandwidth is not None and not self.memory_bandwidth > 0:
            raise ValueError(f"cluster {self.name!r}: memory_bandwidth must be > 0 bytes/s, got {self.memory_bandwidth:g}")

    def _resolve_ring(self) -> None:
        """Fill in `ring_bandwidth` where unset (its docstring) and refuse one that is not positive."""
        ring = self.ring_bandwidth
        if ring is None and self.nodes > 1:
            ring = self.nic_bandwidth * self.nics_per_node / self.devices_per_node
        elif ring is None and self.devices_per_node > 1:
            ring = self.bandwidth[self.devices_per_node]
        if ring is not None and not ring > 0:
            raise ValueError(f"cluster {self.name!r}: ring_bandwidth must be > 0 bytes/s, got {ring:g}")
        object.__setattr__(self, "ring_bandwidth", None if ring is None else float(ring))

    def _resolve_nics(self) -> None:
        """Fill in the NIC fields left unset and refuse a topology no node can have."""
        devices = fill_nic_devices(self.name, self.devices_per_node, self.nics_per_node, self.nic_devices)
        nic_bw = self.nic_bandwidth
        if nic_bw is None and self.nodes > 1:
            nic_bw = self.bandwidth[2 * self.devices_per_node] * self.devices_per_node / len(devices)
        if nic_bw is not None and not nic_bw > 0:
            raise ValueError(f"cluster {self.name!r}: nic_bandwidth must be > 0 bytes/s, got {nic_bw:g}")
        object.__setattr__(self, "nics_per_node", len(devices))
        object.__setattr__(self, "nic_bandwidth", None if nic_bw is None else float(nic_bw))
        object.__setattr__(self, "nic_devices", devices)

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def max_degree(self) -> int:
        """The largest power-of-two SP degree the cluster can hold."""
        return 1 << (self.world_size.bit_length() - 1)

    @property
    def degrees(self) -> list[int]:
        """Every power-of-two SP degree the cluster can hold, ascending."""
        return [1 << i for i in range(self.max_degree.bit_length())]

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def node_ranks(self, node: int) -> range:
        """The global ranks of `node`."""
        return range(node * self.devices_per_node, (node + 1) * self.devices_per_node)

    @property
    def nics(self) -> int:
        """NICs of the whole cluster; global NIC n is NIC n mod nics_per_node of node n // nics_per_node."""
        return self.nodes * self.nics_per_node

    def nic_of(self, rank: int) -> int:
        """The global index of the NIC that serves `rank`: its inter-node bytes leave and enter there
        unless routed."""
        local = rank % self.devices_per_node
        nic = next(i for i, devices in enumerate(self.nic_devices) if local in devices)
        return self.node_of(rank) * self.nics_per_node + nic

    def nic_ranks(self, nic: int) -> list[int]:
        """The global ranks global NIC `nic` serves."""
        base = nic // self.nics_per_node * self.devices_per_node
        return [base + d for d in self.nic_devices[nic % self.nics_per_node]]

    def proxies(self, rank: int) -> list[int]:
        """One rank of `rank`'s node under each of the node's NICs, in NIC order: where a routed
        transfer of `rank` hands (or, at the far side, takes) the chunk crossing that NIC. `rank` is
        its own proxy under its own NIC; under another it is the device at the same position in
        that NIC's list (modulo its length), so the node's ranks share the proxy work evenly."""
        base = self.node_of(rank) * self.devices_per_node
        return [base + proxy(self.nic_devices, rank % self.devices_per_node, nic) for nic in range(self.nics_per_node)]

    def all_to_all_bandwidth(self, degree: int) -> float:
        assert degree > 1, "degree 1 needs no all-to-all"
        return self.bandwidth[degree]

    def check_world_size(self, world_size: int, nodes: int | None = None) -> None:
        """Raise if this cluster does not describe `world_size` ranks (in `nodes` nodes, if given)."""
        if world_size != self.world_size:
            raise ValueError(
                f"cluster {self.name!r} has {self.nodes} x {self.devices_per_node} = "
                f"{self.world_size} devices but the job has world size {world_size}")
        if nodes is not None and nodes != self.nodes:
            raise ValueError(f"cluster {self.name!r} has {self.nodes} nodes of {self.devices_per_node} devices "
                             f"but the job asks for {nodes} nodes")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Cluster:
        return from_fields(cls, data, "cluster")

    @classmethod
    def load(cls, path: str | Path) -> Cluster:
        """Load a custom cluster from a `.toml` or `.json` file (fields as in this class)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"cluster file {path} does not exist")
        if path.suffix == ".toml":
            try:
                data = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"cluster file {path}: cannot parse TOML: {e}") from None
        else:
            data = read_json(path, "cluster file")
        data.setdefault("name", path.stem)
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"cluster file {path}: {e}") from e


# --- presets -------------------------------------------------------------------------------
# FlexSP (Wang et al., ASPLOS'25) measured the effective all-to-all bandwidth of its A100
# cluster per SP degree (docs/design.md). Dividing by the links' specifications gives how much of a
# link an all-to-all of that degree gets; we reuse those fractions for the Hopper presets so
# that their tables have the same shape, scaled by their own links.
_A100_NVLINK = 300 * GB   # NVLink 3: 600 GB/s bidirectional per A100 -> 300 GB/s each way
_A100_NIC = 25 * GB       # one HDR InfiniBand 200 Gb/s NIC per GPU (DGX A100)
_FLEXSP_A100_BW = {2: 119.5 * GB, 4: 104.1 * GB, 8: 96.5 * GB,
                   16: 10.3 * GB, 32: 5.9 * GB, 64: 4.9 * GB}


# Kernel launches and small collectives of one micro-batch's forward and backward on a GPU.
_GPU_MICRO_BATCH_OVERHEAD = 5e-3


def _link_fraction(degree: int) -> float:
    """Fraction of the relevant link an all-to-all of `degree` achieved on FlexSP's A100s."""
    degree = min(degree, 64)
    link = _A100_NVLINK if degree <= 8 else _A100_NIC
    return _FLEXSP_A100_BW[degree] / link


# name: (usable memory, dense bf16 FLOP/s, matmul efficiency, NVLink each way, NICs per node,
# bytes/s of one NIC each way, memory bandwidth). Memory bandwidth from the same datasheets: A100
# 40GB 1,555 GB/s, A800 80GB 2,039 GB/s, H100 and H800 SXM 3.35 TB/s, H200 4.8 TB/s.
# A100: 312 TFLOP/s (A100 datasheet), NVLink 3 (600 GB/s bidirectional), HDR 200 Gb/s per GPU
# (DGX A100: 8 compute NICs), FlexSP's 28 GB usable of 40 -- a 12 GB reserve the others keep too.
# A800 SXM4 80GB: the A100's 312 TFLOP/s with NVLink cut to 400 GB/s bidirectional (NVIDIA A800
# datasheet), 80 GB HBM2e (68 usable after the reserve); nodes of 8 with 4 x 200 Gb/s NICs, two
# GPUs per NIC (the Zeppelin paper's cluster, arXiv 2509.21841).
# H100/H200 SXM: 989 TFLOP/s and NVLink 4, 900 GB/s bidirectional (NVIDIA H100 and H200
# datasheets); 80 GB HBM3 / 141 GB HBM3e; ConnectX-7 NDR 400 Gb/s = 50 GB/s per GPU (DGX
# H100/H200 system specifications: 8 single-port ConnectX-7 per node).
# H800 SXM: the H100's FLOP/s and 80 GB with NVLink cut to 400 GB/s bidirectional (NVIDIA H800
# datasheet); 8 x 400 Gb/s InfiniBand NICs per node of 8, 50 GB/s per GPU (DeepSeek-V3 technical
# report, arXiv 2412.19437, section 3.2.2, which prices its H800 nodes' IB at 50 GB/s per GPU).
GPU_RESERVE = 12 * GB
"""What every GPU preset keeps back of a GPU's memory for the framework, NCCL's buffers and
fragmentation: its usable memory is the card's less this (A100 40 -> 28 GB, H100 80 -> 68)."""
_GPUS = {
    "a100": (28 * GB, 312e12, 0.5, _A100_NVLINK, 8, _A100_NIC, 1555 * GB),
    "a800": (68 * GB, 312e12, 0.5, 200 * GB, 4, 25 * GB, 2039 * GB),
    "h100": (68 * GB, 989e12, 0.45, 450 * GB, 8, 50 * GB, 3350 * GB),
    "h800": (68 * GB, 989e12, 0.45, 200 * GB, 8, 50 * GB, 3350 * GB),
    "h200": (129 * GB, 989e12, 0.45, 450 * GB, 8, 50 * GB, 4800 * GB),
}
_GPUS_PER_NODE = 8


def _gpu_cluster(name: str, gpu: str, devices: int) -> Cluster:
    """`devices` GPUs in DGX-style nodes of 8 (fewer, a power of two: one node of them, as a
    machine of 1, 2 or 4 GPUs); the bandwidth table has FlexSP's shape.

    An all-to-all across nodes gets each GPU its share of the node's NICs, nics x NIC bandwidth
    / 8 (the NIC of an A100, an H100 or an H200; half an A800's), times FlexSP's link fraction
    of that degree: so an A800 node's degrees above 8 are half an A100 node's."""
    partial = 0 < devices < _GPUS_PER_NODE and is_power_of_two(devices)
    if not partial and (devices < _GPUS_PER_NODE or devices % _GPUS_PER_NODE):
        raise ValueError(f"cluster {name!r}: devices must be 1, 2, 4 or a positive multiple of {_GPUS_PER_NODE}")
    memory, flops, efficiency, nvlink, nics, nic, memory_bandwidth = _GPUS[gpu]
    nic_share = nics * nic / _GPUS_PER_NODE
    bandwidth = {d: _link_fraction(d) * (nvlink if d <= _GPUS_PER_NODE else nic_share)
                 for d in (1 << i for i in range(1, devices.bit_length()))}
    per_node = devices if partial else _GPUS_PER_NODE
    return Cluster(name, devices // per_node, per_node, memory, flops, efficiency, bandwidth,
                   _GPU_MICRO_BATCH_OVERHEAD, nics_per_node=max(1, nics * per_node // _GPUS_PER_NODE), nic_bandwidth=nic,
                   memory_bandwidth=memory_bandwidth)


# gloo on a 2-core x86 host, from `ballast profile` of `tiny` (bench/results/*profile*.json):
# all-to-alls move 0.7 GB/s and cost 0.8-1.0 ms per call, 6 ms per layer at degree 2 counting
# the waits for the peer, so 1.5 ms for each of a layer's four calls; a micro-batch's fixed
# cost is 2-4 ms. The runtime trains in fp32 on CPU.
_CPU_ALL_TO_ALL = 0.7 * GB
_CPU_ALL_TO_ALL_LATENCY = 1.5e-3
_CPU_MICRO_BATCH_OVERHEAD = 2e-3


# AdamW's step with the gradient norm before it (32 bytes a parameter, `whole_step.OPTIMIZER_BYTES`)
# on one core of this machine: 11.3-11.5 GB/s at 2M and 8M parameters (torch 2.13, foreach).
_CPU_MEMORY_BANDWIDTH = 11 * GB


_CPU_DEVICE_MEMORY = 4 * GB
"""The cpu preset's budget per rank unless --device-memory-gb sets one."""


def _cpu_cluster(world_size: int | None, nodes: int | None) -> Cluster:
    # This machine: `world_size` gloo ranks, as one node or as `nodes` emulated ones, each rank
    # under its own NIC (so 4 ranks as 2 nodes have 2 NICs per node to route over). The figures
    # are this kind of machine's until `ballast profile` measures the real one; memory is a
    # setting that stands in for a GPU's capacity; a NIC moves what gloo moves between ranks.
    world, nodes = world_size or 2, nodes or 1
    if not is_power_of_two(world):
        raise ValueError(f"cpu cluster: world size must be a power of two, got {world}")
    if world % nodes:
        raise ValueError(f"cpu cluster: {world} ranks do not form {nodes} nodes of equal size")
    bw = {1 << i: _CPU_ALL_TO_ALL for i in range(1, world.bit_length())}
    return Cluster("cpu", nodes, world // nodes, _CPU_DEVICE_MEMORY, 5e10, 1.0, bw, _CPU_MICRO_BATCH_OVERHEAD,
                   _CPU_ALL_TO_ALL_LATENCY, value_bytes=4, nic_bandwidth=_CPU_ALL_TO_ALL,
                   memory_bandwidth=_CPU_MEMORY_BANDWIDTH)


PRESETS = ("a100-64", "a800-64", "h100-32", "h800-32", "h200-32", "cpu")
"""Named presets; `a100-N`, `a800-N`, `h100-N`, `h800-N` and `h200-N` work for N = 1, 2, 4 (one
node of them) or any multiple of 8."""


def default_cluster(world_size: int, gpu_name: str | None) -> str:
    """The cluster a job of `world_size` ranks runs on when none is named: `cpu` for ranks on
    the CPU (`gpu_name` None); on GPUs the preset of their model (`torch.cuda.get_device_name`:
    "NVIDIA H100 80GB HBM3" -> h100-<world>), whose figures are the SXM part's. A GPU no preset
    describes is an error naming --cluster: the cpu preset's figures would plan it silently wrong."""
    if gpu_name is None:
        return "cpu"
    found = re.search(r"\b(" + "|".join(_GPUS) + r")\b", gpu_name.lower())
    if found is None:
        raise ValueError(f"no cluster preset describes the GPU {gpu_name!r} ({', '.join(_GPUS)} have presets): "
                         f"give --cluster, a preset such as h100-{world_size} or a .toml/.json file with Cluster's fields")
    return f"{found.group(1)}-{world_size}"


def get_cluster(spec: str, world_size: int | None = None, device_memory_gb: float | None = None,
                nodes: int | None = None) -> Cluster:
    """A preset (`a100-64`, `h100-32`, ..., any `<gpu>-N` of `PRESETS`' GPUs, `cpu`) or a path to
    a TOML/JSON file.

    `world_size` and `nodes`, when given, must match the cluster (the `cpu` preset takes them as
    its size: `world_size` ranks as `nodes` nodes, 1 unless given). `device_memory_gb`, when given,
    is every device's usable memory whatever the cluster (a GPU preset's or a file's is replaced:
    what-if budgets, a card with less free memory).
    """
    gpu, _, devices = spec.partition("-")
    if spec == "cpu":
        cluster = _cpu_cluster(world_size, nodes)
    elif gpu in _GPUS and devices.isdigit():
        cluster = _gpu_cluster(spec, gpu, int(devices))
    elif Path(spec).suffix in (".toml", ".json"):
        cluster = Cluster.load(spec)
    else:
        sized = ", ".join(f"{g}-N" for g in _GPUS)
        raise ValueError(f"unknown cluster {spec!r}: presets are {', '.join(PRESETS)} (or {sized} with N 1, 2, 4 "
                         f"or a multiple of 8), or give a .toml/.json file")
    if world_size is not None:
        cluster.check_world_size(world_size, nodes)
    elif nodes is not None:
        cluster.check_world_size(cluster.world_size, nodes)
    if device_memory_gb is not None:
        cluster = dataclasses.replace(cluster, device_memory=device_memory_gb * GB)
    return cluster
