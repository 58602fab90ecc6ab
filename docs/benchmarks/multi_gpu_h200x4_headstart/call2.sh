#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (b), call 2: xDiT GPU test after the ring-choice fix; one ring call's
# activities in order (16k/32k); NCCL settings that change how many SMs / what chunk sizes P2P uses.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; R=/tmp/res; mkdir -p /tmp/logs $R
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> /tmp/logs/lanes.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 >> $L
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())" >> $L
SH="flux:8192 flux:16896 pixart:16384 flux:32768"
variant() { # name port env...
  local name=$1 port=$2; shift 2
  env "$@" timeout 45 torchrun --nproc_per_node=2 --master_port $port benchmarks/profile_ring_call.py --shapes $SH --out $R/v_$name.json > /tmp/logs/v_$name.log 2>&1; mark v_$name $?
}
( export CUDA_VISIBLE_DEVICES=0,1
  ( sleep 110; for p in $(pgrep -f "multiprocessing-fork"); do echo "--- pid $p"; py-spy dump --pid $p 2>&1 | head -40; done > /tmp/logs/xdit_spy.txt ) &
  SPY=$!
  timeout 150 python3 -m pytest -m gpu -v -rA -s -p no:cacheprovider tests/gpu/test_gpu_xdit.py > /tmp/logs/a1.log 2>&1; mark xdit $?
  kill $SPY 2>/dev/null
  variant base_a 29701 X=1
  variant p2p8 29702 NCCL_MAX_P2P_NCHANNELS=8
  variant p2p4 29703 NCCL_MAX_P2P_NCHANNELS=4
  variant chunk128k 29704 NCCL_P2P_NVL_CHUNKSIZE=131072
  variant base_a2 29705 X=1
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 80 torchrun --nproc_per_node=2 --master_port 29711 benchmarks/profile_ring_call.py --shapes flux:16896 pixart:16384 flux:32768 --defer 0 0.5 --events --out $OUT/profile_events.json > /tmp/logs/b1.log 2>&1; mark events $?
  variant base_b 29712 X=1
  variant cta1 29713 NCCL_CTA_POLICY=1
  variant cta2 29714 NCCL_CTA_POLICY=2
  variant p2p2 29715 NCCL_MAX_P2P_NCHANNELS=2
  variant chunk2m 29716 NCCL_P2P_NVL_CHUNKSIZE=2097152
  variant base_b2 29717 X=1
) &
wait
cat /tmp/logs/lanes.txt >> $L
echo "## a1" >> $L; grep -E "PASSED|FAILED|ERROR|passed|failed|Error|\[xdit" /tmp/logs/a1.log | sed 's/ *\[ *[0-9]*%\]//' | tail -n 40 >> $L
python3 - >> $L <<'PY'
import json, glob, os
for f in sorted(glob.glob("/tmp/res/v_*.json")):
    d = json.load(open(f)); name = os.path.basename(f)[2:-5]
    cells = [f"{r['model']}{r['tokens']}={r['call_ms']:.3f}(x{r['attention_inflation']:.2f},nccl{r['timeline'].get('nccl_in_the_open_ms',0):.2f})" for r in d["rows"]]
    print(name.ljust(10), " ".join(cells))
PY
for f in /tmp/logs/v_*.log; do grep -l -iE "error|Traceback" $f >> $L; done
cp -r /tmp/logs $R/; cd /tmp && tar czf $OUT/res.tgz res
echo "done t=$(( $(date +%s) - T0 ))" >> $L
