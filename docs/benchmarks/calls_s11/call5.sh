#!/usr/bin/env bash
# Eleventh session, call 5 (2 x H200): the launcher's results as plain pickle bytes, on GPUs:
# the GPU tests that launch ranks through tokenring_xdit.tools.launch (NCCL, CUDA tensors).
. docs/benchmarks/device_prelude.sh
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
timeout $(lt 300) $PT tests/gpu/test_gpu_p2p_direct.py tests/gpu/test_gpu_compile_packed.py tests/gpu/test_gpu_ipc.py \
    > $G/gpu_launch.log 2>&1
mark gpu_launch $?; save
tail -n 15 $G/gpu_launch.log >> $L
