#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 4: head start 10 us vs none: ring 2 sweep, ring 4 sweep, PixArt 2048
# end to end, the GPU exactness tests with it on.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; R=/tmp/res; mkdir -p /tmp/logs $R
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> /tmp/logs/lanes.txt; }
( export CUDA_VISIBLE_DEVICES=0,1 TOKENRING_XDIT_COMM_HEAD_START_US=10
  timeout 80 torchrun --nproc_per_node=2 --master_port 29901 benchmarks/ring_sweep.py --out $OUT/sweep_r2_hs10.json > /tmp/logs/a1.log 2>&1; mark sweep_r2_hs10 $?
  timeout 100 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_token_ring.py tests/gpu/test_gpu_graph_cache.py > /tmp/logs/a2.log 2>&1; mark gpu_tests_hs10 $?
) &
( export CUDA_VISIBLE_DEVICES=2,3 TOKENRING_XDIT_COMM_HEAD_START_US=10
  timeout 150 torchrun --nproc_per_node=2 --master_port 29911 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048_hs10.json > /tmp/logs/b1.log 2>&1; mark e2e_hs10 $?
) &
wait
TOKENRING_XDIT_COMM_HEAD_START_US=0 timeout $(left 330) torchrun --nproc_per_node=4 --master_port 29921 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_r4_hs0.json > /tmp/logs/c1.log 2>&1; mark sweep_r4_hs0 $?
TOKENRING_XDIT_COMM_HEAD_START_US=10 timeout $(left 420) torchrun --nproc_per_node=4 --master_port 29922 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_r4_hs10.json > /tmp/logs/c2.log 2>&1; mark sweep_r4_hs10 $?
cat /tmp/logs/lanes.txt >> $L; tail -n 3 /tmp/logs/a2.log >> $L
# (then: the sweep rows and the e2e times, printed into the log)
