"""The exit programs of tests/distributed/test_exit.py on 2 GPUs over NCCL: each exits 0 on
every launch, every rank prints done, and none hangs (before: destroy_process_group could wait
~110 s after CUDA-graphed ring calls). A launch past LAUNCH_TIMEOUT_S fails as a hang.

python -m pytest -m gpu tests/gpu/test_gpu_exit.py -q
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed.test_exit import CASES, check_launches, program

# plus the program whose last collective is TokenRing's (CUDA-graphed calls, no destroy)
GPU_CASES = [("infer", None, False), *CASES]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

LAUNCHES = int(os.environ.get("EXIT_LAUNCHES", "3"))  # fewer for a quick GPU pass
LAUNCH_TIMEOUT_S = 90  # a normal launch takes well under this; a hang in destroy never ends


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("mode", "last", "destroy"), GPU_CASES)
def test_nccl_program_exits_cleanly(tmp_path, mode, last, destroy):
    path = tmp_path / "prog.py"
    path.write_text(program("nccl", mode, last, destroy))
    check_launches(path, LAUNCHES, timeout=LAUNCH_TIMEOUT_S)
