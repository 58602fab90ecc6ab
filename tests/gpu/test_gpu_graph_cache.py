"""The one CUDA-graph cache on one GPU: capture, then replays equal to eager for the output
shapes it serves (a plain tuple of tensors, the ring calls' fast path, and nested outputs)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class _Block(torch.nn.Module):
    def __init__(self, nested: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64, device="cuda")
        self.nested = nested

    def forward(self, x: torch.Tensor, scale: float = 1.0):
        y = self.lin(x) * scale
        if self.nested:
            return {"out": y, "extra": [y.sum(-1), 3]}
        return y, y.relu()


@pytest.mark.parametrize("nested", [False, True], ids=["tuple", "nested"])
def test_replays_equal_eager(nested: bool) -> None:
    from tokenring_xdit.hosts.transformer_graphs import graph_stats, graph_transformer

    torch.manual_seed(0)
    block = _Block(nested)
    eager = _Block(nested)
    eager.load_state_dict(block.state_dict())
    graph_transformer(block)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 64, device="cuda")
            got, want = block(x, scale=2.0), eager(x, scale=2.0)
            if nested:
                assert torch.equal(got["out"], want["out"]) and got["extra"][1] == 3
                assert torch.equal(got["extra"][0], want["extra"][0])
            else:
                assert type(got) is tuple
                assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    stats = graph_stats(block)
    assert (stats.captures, stats.replays) == (1, 3), stats


def test_a_failed_capture_leaves_random_numbers_working() -> None:
    """A capture that fails (here a host sync inside it) is refused and the call stays eager;
    torch then still believes its default CUDA generator is capturing (the failed capture never
    ran the generator's epilogue) and the next torch.randn raised "Offset increment outside graph
    capture encountered unexpectedly" (a diffusers scheduler step, on 2 x H200). The cache puts
    the generator back."""
    from tokenring_xdit.ring.graph_cache import GraphCache

    cache = GraphCache()

    def syncs(leaves):
        (x,) = leaves
        return (x * float((x.sum() > 0).item()),)  # .item(): not capturable

    x = torch.ones(4, device="cuda")
    for _ in range(3):
        (out,) = cache("syncs", [x], syncs, None)
        assert torch.equal(out, x)
    assert cache.stats.captures == 0 and len(cache.stats.refused) == 1, cache.stats
    assert "syncs" in cache.stats.refused[0], cache.stats.refused  # names the offending frame
    noise = torch.randn(3, device="cuda")
    assert noise.isfinite().all()
