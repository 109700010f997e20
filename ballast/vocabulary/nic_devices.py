"""Which local devices each NIC of a node serves: `Cluster.nic_devices`, filled in and checked."""
from __future__ import annotations

from typing import Sequence


def fill_nic_devices(cluster: str, devices_per_node: int, nics_per_node: int | None,
                     nic_devices: list | None) -> list[list[int]]:
    """The local devices each NIC serves, one list per NIC, every device under exactly one NIC.

    Unset `nic_devices`: contiguous equal blocks of `nics_per_node` NICs (one NIC per device when
    that is unset too). ValueErrors name `cluster` and the offending value."""
    nics = nics_per_node if nics_per_node is not None else (
        len(nic_devices) if nic_devices is not None else devices_per_node)
    if nics < 1:
        raise ValueError(f"cluster {cluster!r}: nics_per_node must be >= 1, got {nics}")
    if nic_devices is None:
        if devices_per_node % nics:
            raise ValueError(f"cluster {cluster!r}: nics_per_node {nics} does not divide devices_per_node "
                             f"{devices_per_node}; give nic_devices to say which devices each NIC serves")
        block = devices_per_node // nics
        return [list(range(i * block, (i + 1) * block)) for i in range(nics)]
    if not all(isinstance(served, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool)
                                                         for d in served) for served in nic_devices):
        raise ValueError(f"cluster {cluster!r}: nic_devices must list, for each NIC, the local devices "
                         f"(integers) it serves, got {nic_devices!r}")
    if len(nic_devices) != nics:
        raise ValueError(f"cluster {cluster!r}: nic_devices lists {len(nic_devices)} NICs but nics_per_node "
                         f"is {nics}")
    nic_of: dict[int, int] = {}
    for nic, served in enumerate(nic_devices):
        if not served:
            raise ValueError(f"cluster {cluster!r}: NIC {nic} of nic_devices serves no device")
        for d in served:
            if not 0 <= d < devices_per_node:
                raise ValueError(f"cluster {cluster!r}: NIC {nic} of nic_devices serves device {d}, but a "
                                 f"node's devices are 0 .. {devices_per_node - 1}")
            if d in nic_of:
                raise ValueError(f"cluster {cluster!r}: device {d} is served by two NICs, {nic_of[d]} and {nic}")
            nic_of[d] = nic
    unserved = [d for d in range(devices_per_node) if d not in nic_of]
    if unserved:
        raise ValueError(f"cluster {cluster!r}: device {unserved[0]} has no NIC (nic_devices serves "
                         f"{len(nic_of)} of the node's {devices_per_node} devices)")
    return [list(served) for served in nic_devices]


def proxy(nic_devices: Sequence[Sequence[int]], local: int, nic: int) -> int:
    """The local device that carries local device `local`'s chunks under NIC `nic` (Zeppelin's
    routing): the device at `local`'s position among its own NIC's devices, modulo how many NIC
    `nic` serves. A device is its own proxy under its own NIC, and a NIC's devices spread the
    others' chunks over distinct proxies. The one rule `Cluster.proxies` (pricing) and
    `runtime.routing.NodeNics` (running) both follow."""
    position = next(served.index(local) for served in nic_devices if local in served)
    return nic_devices[nic][position % len(nic_devices[nic])]
