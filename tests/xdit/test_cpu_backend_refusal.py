"""In CPU mode an explicit --attention_backend without a CPU kernel (FLASH, CUDNN, ...) is
refused where xDiT first reads it, naming the cause and the fix, instead of xfuser's
`NameError: name 'flash_attn_func_2' is not defined` at the first attention call."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.speed import scaled
from tokenring_xdit.patches.xfuser_cpu import CPU_BACKENDS, refuse_without_cpu_version

SCRIPT = """
import json, sys
from tokenring_xdit.patches import xfuser_cpu
xfuser_cpu.enable()
from xfuser.config import config as c
from xfuser.core.distributed.runtime_state import RuntimeState
parts = dict(dp_config=c.DataParallelConfig(), sp_config=c.SequenceParallelConfig(),
             tp_config=c.TensorParallelConfig(), fs_config=c.FullyShardConfig(),
             vae_config=c.VaeParallelConfig())
pp = c.PipeFusionParallelConfig(pp_degree=1, attn_layer_num_for_pp=None, dit_parallel_size=1)
out = {}
for name in sys.argv[1:]:
    engine = type("Engine", (), {})()  # the two fields _select_attention_backend reads
    engine.parallel_config = c.ParallelConfig(pp_config=pp, **parts)
    engine.runtime_config = c.RuntimeConfig(attention_backend=name)
    try:
        out[name] = RuntimeState.__new__(RuntimeState)._select_attention_backend(engine).name
    except ValueError as exc:
        out[name] = "refused: " + str(exc)
print(json.dumps(out))
"""


def test_gpu_only_backends_are_refused_first_in_cpu_mode() -> None:
    names = ["FLASH", "cudnn", "SDPA_FLASH", "SDPA"]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["SDPA_FLASH"] == "SDPA_FLASH" and got["SDPA"] == "SDPA", got
    for name in ("FLASH", "cudnn"):
        assert got[name].startswith(f"refused: --attention_backend {name} has no CPU version")
        assert "leave --attention_backend out" in got[name], got[name]


@pytest.mark.parametrize("name", [None, *CPU_BACKENDS, "sdpa_flash"])
def test_cpu_backends_pass(name) -> None:
    refuse_without_cpu_version(name)
