#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 1: xDiT GPU test alone (py-spy if it stalls), the rest of tests/gpu,
# the timeline profile, the USP training smoke launch.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; R=/tmp/res; mkdir -p /tmp/logs $R
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> /tmp/logs/lanes.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >> $L
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version())" >> $L
PYT="python3 -m pytest -m gpu -v -rA -p no:cacheprovider --durations=10"
( export CUDA_VISIBLE_DEVICES=0,1
  ( sleep 100; for p in $(pgrep -f "python"); do echo "--- pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-150)"; py-spy dump --pid $p 2>&1 | head -60; done > /tmp/logs/xdit_spy.txt ) &
  SPY=$!
  timeout 230 $PYT -s tests/gpu/test_gpu_xdit.py > /tmp/logs/a1.log 2>&1; mark xdit $?
  kill $SPY 2>/dev/null
  timeout $(left 380) $PYT tests/gpu/test_gpu_diffusers.py tests/gpu/test_gpu_training.py > /tmp/logs/a2.log 2>&1; mark diffusers_training $?
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 100 torchrun --nproc_per_node=2 --master_port 29671 benchmarks/profile_ring_call.py --shapes all --defer 0 0.5 --out $OUT/profile_timeline.json > /tmp/logs/b1.log 2>&1; mark profile $?
  timeout $(left 250) $PYT tests/gpu/test_gpu_gqa.py tests/gpu/test_gpu_regression.py tests/gpu/test_gpu_watchdog.py tests/gpu/test_gpu_ipc.py > /tmp/logs/b2.log 2>&1; mark gqa_reg_watch_ipc $?
  timeout $(left 380) $PYT tests/gpu/test_gpu_ipc_ring.py > /tmp/logs/b3.log 2>&1; mark ipc_ring $?
) &
wait
SCRIPTS_LOG_DIR=/tmp/slog SCRIPTS_TIMEOUT_S=100 timeout $(left 500) $PYT tests/gpu/test_gpu_scripts.py -k "usp" > /tmp/logs/c1.log 2>&1; mark smoke_usp $?
cat /tmp/logs/lanes.txt >> $L
for f in a1 a2 b2 b3 c1; do echo "## $f" >> $L; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" /tmp/logs/$f.log | sed 's/ *\[ *[0-9]*%\]//' | tail -n 40 >> $L; done
echo "## b1" >> $L; tail -n 60 /tmp/logs/b1.log >> $L
cp -r /tmp/slog /tmp/logs/ 2>/dev/null; cd /tmp && tar czf $OUT/logs.tgz logs
echo "done t=$(( $(date +%s) - T0 ))" >> $L
