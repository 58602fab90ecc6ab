#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 4: why the tiny Flux transformer's capture fails
# (test_gpu_xdit graphed flux), with the capture's error and frame now in the refusal reason.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt
CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 -m pytest -m gpu -q -x -rf -p no:cacheprovider "tests/gpu/test_gpu_xdit.py::test_graphed_transformer_replays_and_matches_eager" > /tmp/a.log 2>&1; echo "rc=$?" >> $L
grep -E "refused|Error|error|assert" /tmp/a.log | cut -c1-1500 | head -30 >> $L
tail -5 /tmp/a.log >> $L
