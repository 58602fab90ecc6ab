#!/usr/bin/env bash
# Issue 34, 2026-11-26, call 2: the held-back own block (defer_own) on GPU: exactness, sweep, profiles, e2e.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; mkdir -p /tmp/logs
sec() { echo "=== $(date +%T) $*" >> $L; }
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >> $L
sec lanes start
( export CUDA_VISIBLE_DEVICES=0,1
  timeout 110 python3 -m pytest -m gpu tests/gpu/test_gpu_token_ring.py tests/gpu/test_gpu_graph_cache.py -q -rf -p no:cacheprovider > /tmp/logs/a_tests.log 2>&1; echo "a_tests rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
  timeout 160 torchrun --nproc_per_node=2 --master_port 29631 benchmarks/ring_sweep.py --out $OUT/sweep2.json > /tmp/logs/a_sweep.log 2>&1; echo "a_sweep rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
  timeout 150 torchrun --nproc_per_node=2 --master_port 29632 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048.json > /tmp/logs/a_e2e.log 2>&1; echo "a_e2e rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
  SCRIPTS_LOG_DIR=/tmp/logs/slog SCRIPTS_TIMEOUT_S=80 timeout 100 python3 -m pytest -m gpu tests/gpu/test_gpu_scripts.py -k train_sweep -q -rA -p no:cacheprovider > /tmp/logs/a_smoke.log 2>&1; echo "a_smoke rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 130 torchrun --nproc_per_node=2 --master_port 29641 benchmarks/profile_ring_call.py --shapes all --defer 0 0.5 --out $OUT/profile.json > /tmp/logs/b_profile.log 2>&1; echo "b_profile rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
  timeout 250 torchrun --nproc_per_node=2 --master_port 29642 benchmarks/e2e_pipeline.py --model flux --sizes 2048 --steps 20 --warmup-steps 2 --repeats 1 --out $OUT/e2e_flux2048.json > /tmp/logs/b_e2e.log 2>&1; echo "b_e2e rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
  LEFT=$(( 470 - ($(date +%s) - T0) )); [ $LEFT -gt 30 ] && timeout $LEFT python3 -m pytest -m gpu tests/gpu/test_gpu_ipc_ring.py tests/gpu/test_gpu_xdit.py tests/gpu/test_gpu_diffusers.py -v -rf -p no:cacheprovider > /tmp/logs/b_suite.log 2>&1; echo "b_suite rc=$? $(date +%T)" >> /tmp/logs/lanes.txt
) &
wait
cat /tmp/logs/lanes.txt >> $L
tail -n 4 /tmp/logs/a_tests.log /tmp/logs/a_smoke.log >> $L; grep -E "PASS|FAIL|passed|failed" /tmp/logs/b_suite.log | tail -n 40 >> $L
sec ring 4, all GPUs
LEFT=$(( 560 - ($(date +%s) - T0) )); [ $LEFT -gt 30 ] && timeout $LEFT torchrun --nproc_per_node=4 --master_port 29651 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep4.json > /tmp/logs/c_sweep4.log 2>&1; echo "sweep4 rc=$?" >> $L
cd /tmp && tar czf $OUT/logs.tgz logs
sec done $(( $(date +%s) - T0 )) s
