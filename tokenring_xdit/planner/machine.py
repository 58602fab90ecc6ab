"""The machine a plan is for: GPUs per node, nodes, the fabric inside a node and between nodes.

Global rank g lives on node g // gpus_per_node. USP puts each ulysses group on U consecutive
ranks and each ring on the ranks of stride U (yunchang's use_ulysses_low=True), so with U equal
to the GPUs per node the ulysses all-to-alls stay inside a node and every ring hop crosses nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from .calibration import KernelTable, load_table
from .fabric import Fabric, fabric
from .params import ModelParams, hbm_gbps, load_params

__all__ = ["Machine", "make_machine"]


@dataclass
class Machine:
    gpu: str
    gpus_per_node: int
    nodes: int
    intra: Fabric
    inter: Fabric
    table: KernelTable
    params: ModelParams

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, a: int, b: int) -> Fabric:
        return self.intra if self.node(a) == self.node(b) else self.inter

    @cached_property
    def hbm_gbps(self) -> float:
        return hbm_gbps(self.gpu)

    def mem_ms(self, nbytes: float) -> float:
        """A memory-bound kernel that reads and writes `nbytes` in total."""
        return nbytes / (self.hbm_gbps * 1e6)

    def describe(self) -> str:
        where = f"{self.nodes} node(s) x {self.gpus_per_node} {self.gpu}"
        inter = f", between nodes {self.inter.name}" if self.nodes > 1 else ""
        return f"{where}, inside a node {self.intra.name}{inter}"


def _as_fabric(f: str | Fabric) -> Fabric:
    return f if isinstance(f, Fabric) else fabric(f)


def make_machine(
    gpus: int,
    nodes: int = 1,
    fabric_name: str | Fabric = "nvswitch",
    inter_name: str | Fabric = "ib",
    gpu: str = "NVIDIA H200",
    table: KernelTable | None = None,
    params: ModelParams | None = None,
) -> Machine:
    """fabric_name: inside a node; inter_name: between nodes. Each is a Fabric, or what
    fabric.fabric() takes: a name, an nccl_peers JSON (a probe), "gbps=G[,latency_us=L]"."""
    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise ValueError(f"--gpus {gpus} must be a positive multiple of --nodes {nodes}")
    intra, inter = _as_fabric(fabric_name), _as_fabric(inter_name)
    if intra.name == inter.name and nodes > 1:  # Machine.link tells them apart by name
        inter = replace(inter, name=inter.name + " (between nodes)")
    return Machine(
        gpu=gpu,
        gpus_per_node=gpus // nodes,
        nodes=nodes,
        intra=intra,
        inter=inter,
        table=table or load_table(gpu),
        params=params or load_params(),
    )
