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
