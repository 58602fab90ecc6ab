#!/usr/bin/env bash
# Issue 34, 2026-11-26, call 3: high-priority NCCL lanes vs normal (same pair, one after the other), profiles,
# e2e, network stand-in training, ulysses 2 x ring 2 training + inference, the rest of the GPU suite.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; R=/tmp/res; mkdir -p /tmp/logs $R
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> /tmp/logs/lanes.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >> $L
( export CUDA_VISIBLE_DEVICES=0,1
  TOKENRING_XDIT_COMM_HIGH_PRIORITY=0 timeout 80 torchrun --nproc_per_node=2 --master_port 29661 benchmarks/ring_sweep.py --out $OUT/sweep2_normal.json > /tmp/logs/a1.log 2>&1; mark sweep_normal $?
  timeout 80 torchrun --nproc_per_node=2 --master_port 29662 benchmarks/ring_sweep.py --out $OUT/sweep2_high.json > /tmp/logs/a2.log 2>&1; mark sweep_high $?
  timeout 90 torchrun --nproc_per_node=2 --master_port 29663 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048.json > /tmp/logs/a3.log 2>&1; mark e2e_pixart $?
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout $(left 330) torchrun --nproc_per_node=2 --master_port 29664 benchmarks/train_sweep.py --seqs 16384 --iters 3 --warmup 1 --out $R/train_net.json > /tmp/logs/a4.log 2>&1; mark train_net $?
) &
( export CUDA_VISIBLE_DEVICES=2,3
  TOKENRING_XDIT_COMM_HIGH_PRIORITY=0 timeout 80 torchrun --nproc_per_node=2 --master_port 29671 benchmarks/profile_ring_call.py --shapes all --defer 0 0.5 --out $OUT/profile_normal.json > /tmp/logs/b1.log 2>&1; mark profile_normal $?
  timeout 80 torchrun --nproc_per_node=2 --master_port 29672 benchmarks/profile_ring_call.py --shapes all --defer 0 0.5 --out $OUT/profile_high.json > /tmp/logs/b2.log 2>&1; mark profile_high $?
  timeout $(left 330) python3 -m pytest -m gpu -v -rf -p no:cacheprovider tests/gpu/test_gpu_xdit.py tests/gpu/test_gpu_diffusers.py tests/gpu/test_gpu_training.py tests/gpu/test_gpu_gqa.py tests/gpu/test_gpu_regression.py tests/gpu/test_gpu_watchdog.py tests/gpu/test_gpu_ipc.py > /tmp/logs/b3.log 2>&1; mark suite $?
) &
wait
cat /tmp/logs/lanes.txt >> $L; grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/logs/b3.log | sed 's/ *\[ *[0-9]*%\]//' | tail -n 60 >> $L
timeout $(left 455) torchrun --nproc_per_node=4 --master_port 29681 benchmarks/train_sweep.py --ulysses 2 --check --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train_u2r2.json > /tmp/logs/c1.log 2>&1; echo "train_u2r2 rc=$? t=$(( $(date +%s) - T0 ))" >> $L
tail -n 30 /tmp/logs/c1.log >> $L
timeout $(left 520) torchrun --nproc_per_node=4 --master_port 29682 benchmarks/ring_sweep.py --ulysses 2 --max-tokens 32768 --iters 10 --warmup 3 --out $R/sweep_u2r2.json > /tmp/logs/c2.log 2>&1; echo "sweep_u2r2 rc=$? t=$(( $(date +%s) - T0 ))" >> $L
cp -r /tmp/logs $R/; cd /tmp && tar czf $OUT/results.tgz res
echo "done t=$(( $(date +%s) - T0 ))" >> $L
