"""Host logic of the IPC transport (no GPU, no processes): flag-word layout, message packing,
inbox growth."""

from __future__ import annotations

import pytest

from tokenring_xdit.ring.comm.ipc.protocol import (
    ALIGN,
    LANES,
    READY,
    TAKEN,
    grown_capacity,
    pack,
    page_bytes,
    word_offset,
)


@pytest.mark.parametrize("size", range(1, 9))
def test_flag_words_are_distinct_and_inside_the_page(size):
    offsets = [
        word_offset(lane, peer, kind, size)
        for lane in range(LANES)
        for peer in range(size)
        for kind in (READY, TAKEN)
    ]
    assert len(set(offsets)) == len(offsets)
    assert all(o % 4 == 0 and 0 <= o <= page_bytes(size) - 4 for o in offsets)
    with pytest.raises(ValueError):
        word_offset(0, size, READY, size)
    with pytest.raises(ValueError):
        word_offset(LANES, 0, READY, size)


def test_pack_aligns_every_piece_and_never_overlaps():
    sizes = [1, 0, 255, 256, 257, 4096 * 3 + 2]
    offsets, total = pack(sizes)
    assert all(o % ALIGN == 0 for o in offsets)
    ends = [o + n for o, n in zip(offsets, sizes, strict=True)]
    assert all(e <= nxt for e, nxt in zip(ends, offsets[1:], strict=False))
    assert ends[-1] <= total and total % ALIGN == 0
    assert pack([]) == ([], 0)


def test_inboxes_grow_rarely_and_only_when_a_message_does_not_fit():
    cap, grows = 0, 0
    for need in [100, 5000, 1 << 20, (1 << 20) + 1, 3 << 20, 10, 7 << 20, 7 << 20]:
        new = grown_capacity(need, cap)
        if need <= cap:
            assert new == 0
        else:
            assert new >= max(need, 2 * cap) and new % (1 << 20) == 0
            cap, grows = new, grows + 1
    assert grows == 4  # 1 MiB, 2 MiB, 4 MiB, 8 MiB


def _metas(transport: str, device: str, gpus: list[int]) -> list:
    from tokenring_xdit.ring.agree.codes import DEVICE_TYPES, TRANSPORT_CODES
    from tokenring_xdit.ring.agree.header import Header

    code, where = TRANSPORT_CODES[transport], DEVICE_TYPES.index(device)
    return [Header(transport=code, device=where, gpu=gpu) for gpu in gpus]


@pytest.mark.parametrize(
    "transport,device,gpus,backend,want",
    [
        ("nccl", "cuda", [7, 7], "nccl", "nccl"),  # asked for: NCCL then refuses, as before
        ("ipc", "cuda", [7, 8], "nccl", "ipc"),
        ("auto", "cuda", [7, 8, 9], "nccl", "nccl"),  # one GPU each
        ("auto", "cuda", [7, 8, 7], "nccl", "ipc"),  # two ranks share a GPU
        ("auto", "cuda", [7, 8], "gloo", "ipc"),  # gloo cannot move CUDA tensors
        ("auto", "cpu", [0, 0], "gloo", "nccl"),  # CPU tensors stay on gloo
    ],
)
def test_the_agreed_transport(transport, device, gpus, backend, want):
    from tokenring_xdit.ring.agree.agreement import _resolve_transport

    assert _resolve_transport(_metas(transport, device, gpus), backend) == want


def test_transport_setting_is_read_and_validated():
    from tokenring_xdit.config import RingConfig

    assert RingConfig.from_env({}).transport == "nccl"
    assert RingConfig.from_env({"TOKENRING_XDIT_TRANSPORT": " IPC "}).transport == "ipc"
    with pytest.raises(ValueError, match="use one of nccl, ipc, auto"):
        RingConfig.from_env({"TOKENRING_XDIT_TRANSPORT": "shm"})
