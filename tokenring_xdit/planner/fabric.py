"""Links between GPUs: latency + bandwidth per traffic pattern, fitted from NCCL measurements.

`benchmarks/diagnostics/nccl_peers.py` times, per message size, three patterns that are exactly
what the schedules do:
  one_way     r -> r+1 only (pairs)                         - a single transfer on a quiet link
  ring        r -> r+1 while r-1 -> r (one peer each way)   - K/V rings, all-gather steps, Q alone
  two_peers   r -> r+1 and r -> r-1 at once, one NCCL group - TokenRing's Q + partial, all-to-all
Each pattern is t = latency + bytes_out_per_rank / bandwidth: bandwidth fitted on the >= 16 MB
messages, latency from the graphed TokenRing's cost per extra transfer
(benchmarks/derive_planner_data.py). A probe run across nodes with several GPUs each (its meta
"multi_node", benchmarks/multi_node.py) is read for what crossed the network: see
`fit_nccl_peers`. Fabrics with no committed measurement (PCIe, InfiniBand)
carry nominal figures that docs/planner.md states and asks to be measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import FABRIC_ALIASES, FABRICS

__all__ = [
    "Link",
    "Fabric",
    "FABRICS",
    "fit_nccl_peers",
    "fabric",
    "load_fabrics",
    "link_fabric",
    "parse_link",
]

DATA_FILE = Path(__file__).with_name("data") / "fabrics.json"
PATTERNS = {"one_way": "one_peer_one_way", "ring": "one_peer_both_ways", "two_peers": "two_peers"}


@dataclass(frozen=True)
class Link:
    latency_ms: float
    gbps: float  # GB/s out per rank (1e9 bytes)

    def ms(self, nbytes: float) -> float:
        return self.latency_ms + nbytes / (self.gbps * 1e6) if nbytes > 0 else 0.0


@dataclass(frozen=True)
class Fabric:
    """One kind of link, with its three patterns; `source` says where the numbers come from."""

    name: str
    one_way: Link
    ring: Link
    two_peers: Link
    source: str = ""

    def pattern(self, name: str) -> Link:
        return getattr(self, name)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Fabric:
        links = {k: Link(**data[k]) for k in PATTERNS}
        return cls(name=data["name"], source=data.get("source", ""), **links)


MIN_FIT_BYTES = 16 * 2**20


def _fit(sizes_bytes: np.ndarray, ms: np.ndarray, latency_ms: float | None) -> Link:
    """Bandwidth from the large messages; latency given, or the fitted intercept.

    nccl_peers times NCCL calls issued from Python back to back, so its intercept is mostly host
    issue cost (modelled apart, params.host_us); the GPU-side latency comes from elsewhere. A
    fitted intercept is capped at the pattern's fastest measured call: three noisy large
    messages can put it above the time a whole small message took.
    """
    big = sizes_bytes >= MIN_FIT_BYTES
    a = np.stack([np.ones(big.sum()), sizes_bytes[big]], axis=1)
    (lat, inv_bw), *_ = np.linalg.lstsq(a, ms[big], rcond=None)
    if latency_ms is None:
        latency_ms = min(max(float(lat), 0.0), float(ms.min()))
    return Link(latency_ms=latency_ms, gbps=1.0 / (float(inv_bw) * 1e6))


# Across nodes with 2 GPUs each the probe's pairs (0->1, 2->3) stay inside a node; the ranks
# that cross are those at a node's edge. two_peers (r -> r+1 and r -> r-1) then sends one
# message per rank over the network while every rank does: the network traffic of a ring
# across nodes, one peer each way at full occupancy. one_peer_both_ways crosses from the edge
# ranks only (a quieter network). Two network peers per rank are not probed: they share the
# rank's link, as link_fabric prices a NIC. (column, network messages per rank) per pattern:
_ACROSS_NODES = {
    "one_way": ("one_peer_both_ways", 1.0),
    "ring": ("two_peers", 1.0),
    "two_peers": ("two_peers", 1.0),
}


def _probe_gpus_per_node(data: dict) -> int:
    return int(data.get("meta", {}).get("multi_node", {}).get("gpus_per_node", 1))


def fit_nccl_peers(
    path: str | Path, name: str | None = None, latency_ms: float | None = None
) -> Fabric:
    """Fit the three patterns of one `nccl_peers_*.json` file. A probe of the multi-node
    launcher with several GPUs per node describes the network between nodes by what crossed
    it (_ACROSS_NODES); with more than 2 GPUs per node fewer ranks cross in the probe than in a
    ring across nodes, so a shared network is priced on the fast side."""
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    # two_peers moves twice the message per rank
    columns = {p: (c, 2.0 if p == "two_peers" else 1.0) for p, c in PATTERNS.items()}
    if _probe_gpus_per_node(data) > 1:
        columns = _ACROSS_NODES
    links = {}
    for pattern, (column, scale) in columns.items():
        pts = [(r["MB"] * 2**20, r[f"{column}_ms"]) for r in rows if r.get(f"{column}_ms")]
        if pattern == "one_way" and not pts:  # odd rank counts have no pairs
            pts = [(r["MB"] * 2**20, r["one_peer_both_ways_ms"]) for r in rows]
        x = np.array([p[0] * scale for p in pts], dtype=float)
        links[pattern] = _fit(x, np.array([p[1] for p in pts], dtype=float), latency_ms)
    return Fabric(name=name or Path(path).stem, source=str(path), **links)


# Nominal fabrics without a committed measurement. Why these numbers: PCIe Gen4 x16 carries
# ~25 GB/s per direction after protocol overhead, shared by everything a GPU sends; with NCCL P2P
# through a PCIe switch two outgoing streams split that link. InfiniBand NDR (400 Gb/s, one NIC
# per GPU) gives ~45 GB/s per direction; two flows from one GPU share its NIC. Latencies are
# NCCL's typical small-message figures. docs/planner.md lists these as "to be measured".
_NOMINAL = {
    "pcie": dict(one_way=Link(0.015, 25.0), ring=Link(0.015, 24.0), two_peers=Link(0.02, 24.0)),
    "ib": dict(one_way=Link(0.012, 45.0), ring=Link(0.012, 44.0), two_peers=Link(0.015, 44.0)),
}


def load_fabrics() -> dict[str, Fabric]:
    """Named fabrics: fitted ones shipped in data/fabrics.json, plus the nominal PCIe and IB."""
    out = {k: Fabric(name=k, source="nominal (not measured)", **v) for k, v in _NOMINAL.items()}
    if DATA_FILE.exists():
        with open(DATA_FILE) as f:
            for entry in json.load(f)["fabrics"]:
                out[entry["name"]] = Fabric.from_dict(entry)
    return out


def link_fabric(
    gbps: float, latency_us: float = 10.0, both_ways_gbps: float | None = None, name: str = ""
) -> Fabric:
    """A network link between nodes as a machine description gives it: `gbps` GB/s out of each
    GPU's NIC one way, `both_ways_gbps` per direction when both directions run (default: the
    same, a full-duplex NIC), `latency_us` per transfer. Two flows from one GPU share its NIC,
    so the multi-peer pattern gets the both-ways bandwidth for all its bytes."""
    if gbps <= 0 or latency_us < 0 or (both_ways_gbps is not None and both_ways_gbps <= 0):
        raise ValueError(f"link: bandwidth must be > 0 and latency >= 0 (gbps={gbps})")
    both = both_ways_gbps or gbps
    lat = latency_us / 1e3
    label = name or f"link {gbps:g} GB/s"
    return Fabric(
        name=label,
        one_way=Link(lat, gbps),
        ring=Link(lat, both),
        two_peers=Link(lat, both),
        source=f"given: {gbps:g} GB/s one way, {both:g} both ways, {latency_us:g} us",
    )


LINK_KEYS = ("gbps", "latency_us", "both_ways_gbps")


def parse_link(text: str) -> Fabric:
    """ "gbps=G[,latency_us=L][,both_ways_gbps=B]" -> link_fabric(...)."""
    values: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in LINK_KEYS:
            raise ValueError(f"link {text!r}: give {','.join(k + '=...' for k in LINK_KEYS)}")
        try:
            values[key] = float(value)
        except ValueError:
            raise ValueError(f"link {text!r}: {key} must be a number") from None
    if "gbps" not in values:
        raise ValueError(f"link {text!r}: gbps=... (GB/s one way) is required")
    return link_fabric(name=text, **values)


def fabric(name: str) -> Fabric:
    """A named fabric; or, for a link between nodes, a probe's result (the path of an
    nccl_peers JSON, e.g. the multi_node launcher's link measurement) or a given link
    ("gbps=50,latency_us=10")."""
    if name.startswith("gbps="):
        return parse_link(name)
    if name.endswith(".json"):
        if not Path(name).is_file():
            raise ValueError(f"fabric probe file {name} does not exist")
        return fit_nccl_peers(name)
    fabrics = load_fabrics()
    key = FABRIC_ALIASES.get(name, name)
    if key not in fabrics:
        raise ValueError(
            f"unknown fabric '{name}'; use one of {', '.join(sorted(fabrics))}, an nccl_peers "
            "JSON (probe) or gbps=G[,latency_us=L][,both_ways_gbps=B]"
        )
    return fabrics[key]
