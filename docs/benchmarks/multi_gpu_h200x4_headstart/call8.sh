#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 8: training ring 4 at 16k again, head start 10 us first, then 0 (order swapped).
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt
TOKENRING_XDIT_COMM_HEAD_START_US=10 timeout 100 torchrun --nproc_per_node=4 --master_port 29993 benchmarks/train_sweep.py --seqs 16384 --iters 5 --warmup 2 --out $OUT/train_r4_16k_hs10.json > /tmp/t8a.log 2>&1; echo "hs10 rc=$?" >> $L
TOKENRING_XDIT_COMM_HEAD_START_US=0 timeout 100 torchrun --nproc_per_node=4 --master_port 29994 benchmarks/train_sweep.py --seqs 16384 --iters 5 --warmup 2 --out $OUT/train_r4_16k_hs0.json > /tmp/t8b.log 2>&1; echo "hs0 rc=$?" >> $L
grep "token_ring'" /tmp/t8a.log /tmp/t8b.log >> $L
