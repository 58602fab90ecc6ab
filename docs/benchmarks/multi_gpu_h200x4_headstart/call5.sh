#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 5 (head start 10 us gated, defer auto still 0.5 from 8192 only):
# held-back share at 4-8k local queries; Flux 2048 end to end; ring 4 sweep.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; mkdir -p /tmp/logs5
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
( export CUDA_VISIBLE_DEVICES=0,1
  timeout 90 torchrun --nproc_per_node=2 --master_port 29951 benchmarks/profile_ring_call.py --shapes flux:4608 flux:8192 pixart:4096 pixart:16384 flux:16896 --defer 0 0.25 0.5 --out $OUT/profile_defer_hs10.json > /tmp/logs5/a1.log 2>&1
  TOKENRING_XDIT_DEFER_OWN=0.5 timeout 80 torchrun --nproc_per_node=2 --master_port 29952 benchmarks/ring_sweep.py --max-tokens 16896 --out $OUT/sweep_r2_defer05.json > /tmp/logs5/a2.log 2>&1
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 200 torchrun --nproc_per_node=2 --master_port 29961 benchmarks/e2e_pipeline.py --model flux --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_flux2048_hs10.json > /tmp/logs5/b1.log 2>&1
) &
wait
timeout $(left 300) torchrun --nproc_per_node=4 --master_port 29971 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_r4_default.json > /tmp/logs5/c1.log 2>&1
# (then: the profile rows, sweep rows and e2e times, printed into the log)
