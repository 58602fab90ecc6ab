#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 7: training at ring 4, head start 0 vs 10 us (same machine, one after the other).
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; mkdir -p /tmp/logs7
TOKENRING_XDIT_COMM_HEAD_START_US=0 timeout 170 torchrun --nproc_per_node=4 --master_port 29991 benchmarks/train_sweep.py --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train_r4_hs0.json > /tmp/logs7/a.log 2>&1; echo "hs0 rc=$?" >> $L
TOKENRING_XDIT_COMM_HEAD_START_US=10 timeout 190 torchrun --nproc_per_node=4 --master_port 29992 benchmarks/train_sweep.py --check --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train_r4_hs10.json > /tmp/logs7/b.log 2>&1; echo "hs10 rc=$?" >> $L
tail -n 25 /tmp/logs7/a.log >> $L; tail -n 40 /tmp/logs7/b.log >> $L
