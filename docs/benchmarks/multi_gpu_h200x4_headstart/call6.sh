#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 6: committed defaults (head start 10 us gated; defer auto 0.25 from 2048
# local queries, 0.5 from 8192): ring 2 sweep on both pairs, then ring 4.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; mkdir -p /tmp/logs6
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
(CUDA_VISIBLE_DEVICES=0,1 timeout 90 torchrun --nproc_per_node=2 --master_port 29981 benchmarks/ring_sweep.py --out $OUT/sweep_r2_final_a.json > /tmp/logs6/a.log 2>&1; echo "a rc=$?" >> $L) &
(CUDA_VISIBLE_DEVICES=2,3 timeout 90 torchrun --nproc_per_node=2 --master_port 29982 benchmarks/ring_sweep.py --out $OUT/sweep_r2_final_b.json > /tmp/logs6/b.log 2>&1; echo "b rc=$?" >> $L) &
wait
timeout $(left 200) torchrun --nproc_per_node=4 --master_port 29983 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_r4_final.json > /tmp/logs6/c.log 2>&1; echo "c rc=$?" >> $L
# (then: the sweep rows, printed into the log)
