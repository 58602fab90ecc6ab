"""The planner's link between nodes: given in the machine description, or fitted from the
multi-node launcher's link probe; USP splits priced with intra-node links for ulysses and the
inter-node link for the ring; validation on the two-node stand-in's sweeps (CPU only)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tokenring_xdit.planner.cost import predict
from tokenring_xdit.planner.fabric import fabric, link_fabric, parse_link
from tokenring_xdit.planner.machine import make_machine
from tokenring_xdit.planner.validate import MAX_MEDIAN_ERROR, report, validate
from tokenring_xdit.tools import cli

STANDIN = (
    Path(__file__).resolve().parents[2]
    / "docs"
    / "benchmarks"
    / "across-nodes-standin-2xh200-2026-11-26"
)
PROBE = {s: STANDIN / f"nccl_peers_socket_{s}.json" for s in ("default", "wide")}
# 4 GPUs: 2 "nodes" x 2 GPUs (P2P inside, sockets across) and 4 one-GPU "nodes"
STANDIN4 = STANDIN.with_name("across-nodes-standin-4xh200-2026-11-26")


def test_a_given_link_has_its_bandwidth_latency_and_shared_nic():
    f = parse_link("gbps=50,latency_us=8,both_ways_gbps=40")
    assert f.one_way.gbps == 50 and f.ring.gbps == 40 and f.two_peers.gbps == 40
    assert f.one_way.latency_ms == pytest.approx(0.008)
    assert f.one_way.ms(50e6) == pytest.approx(0.008 + 1.0)
    assert link_fabric(25.0).ring.gbps == 25.0  # full duplex unless told otherwise
    assert fabric("gbps=50").one_way.gbps == 50


@pytest.mark.parametrize(
    "text, message",
    [("gbps=0", "> 0"), ("latency_us=3", "required"), ("gbps=x", "number"), ("bw=3", "give")],
)
def test_a_bad_link_is_one_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_link(text)


def test_the_probe_fits_the_stand_in_link_at_both_socket_settings():
    slow, fast = fabric(str(PROBE["default"])), fabric(str(PROBE["wide"]))
    # measured: 4.3 / 7.1 GB/s one way, 2.5 / 5.3 GB/s each way with both directions busy
    assert 3.8 < slow.one_way.gbps < 4.8 and 2.2 < slow.ring.gbps < 2.8
    assert 6.5 < fast.one_way.gbps < 7.7 and 4.8 < fast.ring.gbps < 5.8
    with pytest.raises(ValueError, match="does not exist"):
        fabric(str(STANDIN / "missing.json"))


def test_a_probe_with_two_gpus_per_node_fits_the_network_not_nvlink():
    for setting in ("default", "wide"):
        path = STANDIN4 / f"nccl_peers_2x2_{setting}.json"
        rows = json.loads(path.read_text())["rows"]
        f = fabric(str(path))
        # its pairs (0->1, 2->3) stay inside a node: ~50 GB/s over P2P, not the network
        assert max(r["one_peer_one_way_GBps_per_rank_out"] for r in rows) > 40
        assert max(f.pattern(p).gbps for p in ("one_way", "ring", "two_peers")) < 10
        # two_peers crosses once per rank (the other peer is inside the node): the ring across
        # nodes is priced at that rate, one 256 MB message per rank over the network
        big = max(rows, key=lambda r: r["MB"])
        rate = big["MB"] * 2**20 / (big["two_peers_ms"] * 1e6)
        assert f.ring.gbps == pytest.approx(rate, rel=0.3) and f.two_peers == f.ring


def test_a_fitted_latency_is_never_above_the_fastest_call_of_its_pattern():
    columns = {"one_way": "one_peer_both_ways", "ring": "two_peers", "two_peers": "two_peers"}
    for path in sorted(STANDIN4.glob("nccl_peers_*.json")):
        rows = json.loads(path.read_text())["rows"]
        f = fabric(str(path))
        for pattern, column in columns.items():
            if "4x1" in path.name:  # one GPU per node: the probe's own columns
                column = {"one_way": "one_peer_one_way", "ring": "one_peer_both_ways"}.get(
                    pattern, column
                )
            assert 0 <= f.pattern(pattern).latency_ms <= min(r[f"{column}_ms"] for r in rows)


def test_validate_predicts_the_two_level_stand_in_as_ulysses_inside_ring_across():
    checks, picks = validate(STANDIN4)
    assert {c.file for c in checks} == {
        f"across-nodes-standin-4xh200-2026-11-26/sweep_{s}.json"
        for s in ("2x2_u2_default", "2x2_u2_wide", "4x1_wide")
    }
    assert len(checks) == 120 and len(picks) == 24
    two_level = [c for c in checks if "2x2" in c.file]
    assert {(c.ulysses, c.ring) for c in two_level} == {(2, 2), (4, 1)}
    # the send/recv rings across the network, priced at the probe's full-occupancy rate (before
    # that rate was read from the probe, TokenRing's were 20-45 % under)
    p2p = [abs(c.error) for c in two_level if c.method in ("token_ring", "yunchang_p2p")]
    assert statistics.median(p2p) <= MAX_MEDIAN_ERROR


def test_ulysses_inside_ring_across_prices_each_link_where_it_runs():
    one = make_machine(16, nodes=1, fabric_name="nvswitch")
    two = make_machine(16, nodes=2, fabric_name="nvswitch", inter_name="gbps=5,latency_us=20")
    assert two.link(0, 7) is two.intra and two.link(0, 8) is two.inter
    # ulysses 8 inside a node: the same all-to-all on both machines; only the ring pays the link
    a = predict(one, "token_ring", 32, 128, 65536, 8, 2)
    b = predict(two, "token_ring", 32, 128, 65536, 8, 2)
    assert a.parts["all_to_all"] == pytest.approx(b.parts["all_to_all"])
    assert b.ms > a.ms
    # ulysses 16 sends across the network: its all-to-all is far slower than inside one node
    assert (
        predict(two, "ulysses", 32, 128, 65536, 16, 1).parts["all_to_all"]
        > 5 * predict(one, "ulysses", 32, 128, 65536, 16, 1).parts["all_to_all"]
    )


def test_same_fabric_inside_and_between_nodes_stays_two_links():
    m = make_machine(4, nodes=2, fabric_name="ib", inter_name="ib")
    assert m.intra.name != m.inter.name and m.link(0, 2) is m.inter


def test_validate_on_the_stand_in_meets_the_error_target():
    checks, picks = validate(STANDIN)
    assert {c.file for c in checks} == {
        f"across-nodes-standin-2xh200-2026-11-26/sweep_socket_{s}.json"
        for s in ("default", "default_run2", "wide", "wide_run2")
    }
    assert len(checks) == 160 and len(picks) == 32
    assert statistics.median(abs(c.error) for c in checks) <= MAX_MEDIAN_ERROR
    # where the link is slow the all-gather ring leads by 20-40 % and the model picks it; on
    # the wider link the measured best flips between two runs of the same sweep (see the folder's
    # README), so the picks there are scored but not asserted
    assert all(p[3] for p in picks if "default" in p[0])
    text, _ = report(STANDIN)
    assert "median abs error" in text


def test_plan_takes_a_probe_or_a_given_link_between_nodes(capsys):
    base = ["plan", "--heads", "24", "--head-dim", "128", "--tokens", "65536", "--nodes", "2"]
    assert cli.main([*base, "--gpus", "2", "--inter-fabric", str(PROBE["default"])]) == 0
    out = capsys.readouterr().out
    assert "between nodes nccl_peers_socket_default" in out and "best: " in out
    assert cli.main([*base, "--gpus", "16", "--inter-fabric", "gbps=50,latency_us=10"]) == 0
    assert "best: ulysses 8 x ring 2" in capsys.readouterr().out
    assert cli.main([*base, "--gpus", "16", "--inter-fabric", "gbps=fast"]) == 2
    assert "gbps must be a number" in capsys.readouterr().err
