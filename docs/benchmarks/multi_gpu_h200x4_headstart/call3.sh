#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 3: the compute stream's head start for NCCL (COMM_HEAD_START_US)
# at ring 2 (profiles + sweeps, same pair) and ring 4; one call's activities with it on.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; R=/tmp/res; mkdir -p /tmp/logs $R
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> /tmp/logs/lanes.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >> $L
SH="flux:8192 flux:16896 pixart:16384 flux:32768 flux:65536 pixart:65536"
variant() { # name port nproc us
  TOKENRING_XDIT_COMM_HEAD_START_US=$4 timeout 70 torchrun --nproc_per_node=$3 --master_port $2 benchmarks/profile_ring_call.py --shapes $SH --out $R/v_$1.json > /tmp/logs/v_$1.log 2>&1; mark v_$1 $?
}
( export CUDA_VISIBLE_DEVICES=0,1
  variant r2_hs0 29801 2 0
  variant r2_hs10 29802 2 10
  variant r2_hs25 29803 2 25
  variant r2_hs50 29804 2 50
  variant r2_hs0b 29805 2 0
  variant r2_hs25b 29806 2 25
) &
( export CUDA_VISIBLE_DEVICES=2,3
  TOKENRING_XDIT_COMM_HEAD_START_US=25 timeout 60 torchrun --nproc_per_node=2 --master_port 29811 benchmarks/profile_ring_call.py --shapes flux:16896 pixart:16384 flux:32768 --defer 0.5 --events --out $R/events_hs25.json > /tmp/logs/b1.log 2>&1; mark events $?
  TOKENRING_XDIT_COMM_HEAD_START_US=0 timeout 80 torchrun --nproc_per_node=2 --master_port 29812 benchmarks/ring_sweep.py --out $OUT/sweep_hs0.json > /tmp/logs/b2.log 2>&1; mark sweep_hs0 $?
  TOKENRING_XDIT_COMM_HEAD_START_US=25 timeout 80 torchrun --nproc_per_node=2 --master_port 29813 benchmarks/ring_sweep.py --out $OUT/sweep_hs25.json > /tmp/logs/b3.log 2>&1; mark sweep_hs25 $?
) &
wait
variant r4_hs0 29821 4 0
variant r4_hs25 29822 4 25
variant r4_hs0b 29823 4 0
cat /tmp/logs/lanes.txt >> $L
# (then: the per-variant summary lines, the events of events_hs25.json and the sweep rows, printed into the log)
cp -r /tmp/logs $R/; cd /tmp && tar czf $OUT/res.tgz res
