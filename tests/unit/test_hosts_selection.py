"""`--ring_impl_type auto`: the per-signature decision, pure (no process group, no GPU).

The decision must be a function of inputs every rank of a ring shares, and must switch where the
planner's model has TokenRing and the all-gather ring cross over (H200, P2P off, ring 2: the
all-gather ring below 4096 tokens of 24 x 128 heads, TokenRing from there, where the held-back
own block starts hiding its last return).
"""

from __future__ import annotations

import torch

from tokenring_xdit import config
from tokenring_xdit.hosts import selection
from tokenring_xdit.planner.choose import choose_ring, ring_times

H200_P2P_OFF = dict(dtype="bfloat16", device_name="NVIDIA H200", fabric="p2p-off", graphs=True)


def _h200_call(q_len: int, fabric: str = "p2p-off") -> selection.AutoSignature:
    """A Flux-like (24 x 128) ring-2 signature as a CUDA rank on an H200 would build it."""
    return selection.AutoSignature(
        batch=1,
        heads=24,
        head_dim=128,
        q_len=q_len,
        kv_len=q_len,
        ring=2,
        dtype="bfloat16",
        device_type="cuda",
        device_name="NVIDIA H200",
        fabric=fabric,
        graphs=True,
    )


def test_identical_inputs_give_identical_answers() -> None:
    args = (24, 128, 2304, 2304, 2)
    answers = {choose_ring(*args, **H200_P2P_OFF) for _ in range(3)}
    choose_ring.cache_clear()  # a fresh process (another rank) computes it again
    answers.add(choose_ring(*args, **H200_P2P_OFF))
    assert len(answers) == 1
    # two equal signatures built apart (two ranks) hash alike and get one decision
    selection.reset_decisions()
    first = selection.decide(_h200_call(2304))
    selection.reset_decisions()
    assert selection.decide(_h200_call(2304)) == first


def test_switches_at_the_ring_crossover_h200_p2p_off() -> None:
    # 3840 tokens over ring 2: one all-gather of K/V beats TokenRing's per-step Q + partial
    assert choose_ring(24, 128, 1920, 1920, 2, **H200_P2P_OFF) == "default"
    # 4608 tokens (Flux 1024 px): TokenRing's transfers hide under longer kernels
    assert choose_ring(24, 128, 2304, 2304, 2, **H200_P2P_OFF) == "token_ring"
    tr, ag = ring_times(24, 128, 2304, 2304, 2, **H200_P2P_OFF)
    assert tr < ag
    # on NVSwitch the same 3840 tokens already go to TokenRing: the fabric matters
    assert choose_ring(24, 128, 1920, 1920, 2, "bfloat16", "NVIDIA H200", "nvswitch") == (
        "token_ring"
    )


def test_decision_and_log_line() -> None:
    selection.reset_decisions()
    below, above = selection.decide(_h200_call(1920)), selection.decide(_h200_call(2304))
    assert (below.impl, above.impl) == (selection.DEFAULT, selection.TOKEN_RING)
    line = selection.describe(_h200_call(2304), above, "xDiT's own ring")
    assert line.startswith("ring attention: auto -> TokenRing for 24x128, 4608 tokens, ring 2 ")
    assert "predicted" in line and "NVIDIA H200, p2p-off, graphed" in line, line
    assert "auto -> xDiT's own ring for" in selection.describe(
        _h200_call(1920), below, "xDiT's own ring"
    )


def test_cpu_and_refused_calls_are_decided_by_rule() -> None:
    """No calibration on CPU: TokenRing, and no planner call; calls TokenRing refuses keep the
    host's ring."""
    x = torch.zeros(1, 4, 6, 16)
    cpu = selection.ring_call(x, 1, 4, 16, 6, 6, 2)
    assert (cpu.device_type, cpu.device_name, cpu.dtype) == ("cpu", "cpu", "float32")
    decision = selection.decide(cpu)
    assert decision.impl == selection.TOKEN_RING and "no calibration" in decision.why
    refused = selection.decide(selection.ring_call(x, 1, 4, 16, 6, 6, 2, refused="dropout"))
    assert refused.impl == selection.DEFAULT and "dropout" in refused.why
    assert selection.decide(selection.ring_call(x, 1, 4, 16, 6, 6, 1)).impl == selection.DEFAULT


def test_fabric_comes_from_the_environment() -> None:
    env = config.ENV["fabric"][0]
    assert config.RingConfig.from_env({}).auto_fabric() == "nvswitch"
    assert config.RingConfig.from_env({"NCCL_P2P_DISABLE": "1"}).auto_fabric() == "p2p-off"
    both = {"NCCL_P2P_DISABLE": "1", env: "PCIe"}
    assert config.RingConfig.from_env(both).auto_fabric() == "pcie"


def test_auto_is_a_valid_choice(monkeypatch) -> None:
    assert "auto" in config.RING_IMPLS
    monkeypatch.setenv(selection.RING_IMPL_ENV, "auto")
    try:
        selection.reset()
        assert selection.xdit_ring_impl() == ("auto", selection.RING_IMPL_ENV)
        selection.set_xdit_ring_impl("auto")
        assert selection.xdit_ring_impl() == ("auto", "set_xdit_ring_impl()")
    finally:
        selection.reset()
