"""tokenring_xdit.hosts.transformer_graphs on CPU: what can be checked without a GPU.

Capture and replay need CUDA (tests/gpu/test_gpu_xdit.py::test_graphed_transformer_*); here:
the module stays exactly itself on CPU, graphing is idempotent and reversible, and arguments a
graph cannot see (CPU tensors, arbitrary objects, autograd) keep the call eager.
"""

from __future__ import annotations

import torch

from tokenring_xdit.hosts import transformer_graphs as tg
from tokenring_xdit.ring.comm.teardown import holds_graphs


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: float = 1.0, return_dict: bool = True):
        y = self.proj(x) * scale
        return {"sample": y} if return_dict else (y,)


def test_graphing_is_idempotent_and_reversible() -> None:
    block = _Block()
    assert "forward" not in vars(block)
    assert tg.graph_transformer(block) is True
    assert isinstance(vars(block)["forward"], tg.GraphedForward)
    assert tg.graph_transformer(block) is False  # already graphed: nothing stacks
    assert tg.graph_stats(block) is not None
    assert tg.ungraph_transformer(block) is True
    assert "forward" not in vars(block) and tg.graph_stats(block) is None
    assert tg.ungraph_transformer(block) is False


def test_a_foreign_instance_forward_is_restored() -> None:
    """xDiT's torch.compile sets an instance forward; ungraphing gives that one back."""
    block = _Block()
    compiled = block.forward  # stands in for torch.compile(block.forward)
    block.forward = compiled
    tg.graph_transformer(block)
    tg.ungraph_transformer(block)
    assert vars(block)["forward"] is compiled


def test_cpu_calls_stay_eager_and_exact() -> None:
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(2, 8)
    with torch.no_grad():
        want = block(x, scale=0.5, return_dict=False)[0]
        tg.graph_transformer(block)
        got = block(x, scale=0.5, return_dict=False)[0]
        got_dict = block(x, scale=0.5)["sample"]
    assert torch.equal(got, want) and torch.equal(got_dict, want)
    stats = tg.graph_stats(block)
    assert (stats.captures, stats.replays, stats.eager) == (0, 0, 2)


def test_keys_only_for_what_a_graph_can_replay() -> None:
    graphed = tg.GraphedForward(lambda *a, **k: None)
    cpu = torch.zeros(2)
    with torch.no_grad():
        assert graphed._key([cpu], None) is None  # CPU values would be baked in
        meta = torch.empty(2, device="meta")
        assert graphed._key([meta], None) is None
        assert graphed._key([object()], None) is None  # state a key cannot see
    with torch.enable_grad():
        assert graphed._key([1.0], None) is None  # autograd: never graphed


def test_reset_all_graphs_reaches_every_graphed_module() -> None:
    blocks = [_Block(), _Block()]
    for b in blocks:
        tg.graph_transformer(b)
        vars(b)["forward"].graphs._graphs["k"] = None  # as if a key had been refused
        holds_graphs(vars(b)["forward"].graphs)  # what its capture does
    tg.reset_all_graphs()
    assert all(len(vars(b)["forward"].graphs) == 0 for b in blocks)


def test_a_refused_capture_names_the_op_that_broke_it():
    """torch's capture_end raises its own "previous error during capture" on top of the error of
    the op that broke the capture; the refusal reason reports the first one, with its frame."""
    from tokenring_xdit.ring.graph_cache import _first_error

    def host_sync():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nhint")

    # torch's capture_end, as the frame it raises from (torch/cuda/graphs.py) names it
    capture_end = compile(
        "raise RuntimeError('operation failed due to a previous error during capture')",
        "/site-packages/torch/cuda/graphs.py",
        "exec",
    )
    try:
        try:
            host_sync()
        finally:
            exec(capture_end)
    except RuntimeError as exc:
        reason = _first_error(exc)
    assert reason.startswith("RuntimeError: CUDA error: operation not permitted"), reason
    assert "in host_sync" in reason and "hint" not in reason, reason
    # an exception that did not leave a capture is reported as it is, whatever its context
    try:
        try:
            host_sync()
        except RuntimeError:
            raise ValueError("a capturable op's own error") from None
    except ValueError as exc:
        assert _first_error(exc).startswith("ValueError: a capturable op's own error")
