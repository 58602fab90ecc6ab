#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 5 (final code): capture-robustness GPU tests (+ the
# watchdog race shown without the fix), test_gpu_xdit twice, PixArt 2048 on both pairs, then the
# 24-script smoke on both pairs.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $G/lanes.txt; }
PYT="python3 -m pytest -m gpu -q -rf -p no:cacheprovider"
( export CUDA_VISIBLE_DEVICES=0,1
  CUDA_VISIBLE_DEVICES=0 timeout 60 $PYT tests/gpu/test_gpu_watchdog.py tests/gpu/test_gpu_graph_cache.py > $G/a1.log 2>&1; mark watchdog_graph_cache $?
  CUDA_VISIBLE_DEVICES=0 timeout 30 python3 - > $G/a2.log 2>&1 <<'PY'
# the same race without the fix: the watchdog thread left in the global capture mode
import time, torch
from tokenring_xdit.ring.comm import watchdog
watchdog.thread_local_capture_mode = lambda: False
from tests.gpu.test_gpu_watchdog import test_polling_during_a_capture_leaves_the_capture_intact as t
try:
    t(); print("without the fix: capture survived")
except Exception as e:
    print("without the fix:", type(e).__name__, str(e).splitlines()[0][:200])
PY
  mark race_demo $?
  timeout 120 $PYT tests/gpu/test_gpu_xdit.py > $G/a3.log 2>&1; mark gpu_xdit_a $?
  timeout 150 torchrun --nproc_per_node=2 --master_port 29901 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048_final_a.json > $G/a4.log 2>&1; mark e2e_pixart_a $?
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 120 $PYT tests/gpu/test_gpu_xdit.py > $G/b1.log 2>&1; mark gpu_xdit_b $?
  timeout 150 torchrun --nproc_per_node=2 --master_port 29911 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048_final_b.json > $G/b2.log 2>&1; mark e2e_pixart_b $?
) &
wait
SCRIPTS_LOG_DIR=/tmp/slog SCRIPTS_TIMEOUT_S=100 timeout $(left 540) $PYT -rA tests/gpu/test_gpu_scripts.py > $G/c1.log 2>&1; mark smoke $?
cat $G/lanes.txt >> $L
for f in a1 a2 a3 b1; do tail -n 3 $G/$f.log >> $L; done
grep -E "PASSED|FAILED|ERROR|passed|failed" $G/c1.log | tail -30 >> $L
python3 - >> $L <<'PY'
import json, os
O = os.environ["OUT"]
for f in ("e2e_pixart2048_final_a.json", "e2e_pixart2048_final_b.json"):
    try:
        r = json.load(open(f"{O}/{f}"))["rows"][0]
        print(f, {k: round(v, 3) for k, v in r.items() if k.endswith("_s")}, r.get("graph_stats_token_ring_graph"))
    except Exception as e: print(f, "missing", e)
PY
cd $G && tar czf $OUT/logs.tgz *.log /tmp/slog 2>/dev/null
echo "done t=$(( $(date +%s) - T0 ))" >> $L
