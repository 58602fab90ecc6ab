#!/usr/bin/env bash
# Ninth session, call 3 (4 GPUs; from the repository root, $OUT set; carry .whl/base, .whl/diag
# and .old = `git archive c9d636a tokenring_xdit benchmarks tests`, before the eighth session's
# watchdog change). Phase A, two GPU pairs at once: (0,1) the torchrun restart scenario twice
# with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, then the soak under expandable segments (it did not
# finish 10^4 calls in 540 s, call 2);
# (2,3) ring-2 inference new / old alternated (the watchdog now reuses its events), then the
# soak under expandable segments with NCCL_GRAPH_REGISTER=0.
# Phase B, all 4 GPUs: packed training graphs (exactness, speed) and the direct P2P path.
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
echo "py-spy: $(which py-spy)" >> $L
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
SITE=$PWD/.site; ROOT=$PWD
sweep() {  # who gpus nproc tag port limit [extra env]
  local D=$ROOT
  [ $1 = old ] && D=$ROOT/.old
  ( cd $D && env $7 CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$SITE:$D timeout $(lt $6) torchrun --nproc_per_node=$3 --master_port $5 \
      benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep$3_$1_$4.json ) > $G/sweep$3_$1_$4.log 2>&1
  mark sweep$3_$1_$4 $?
}
# The soak under expandable segments (a hang rather than slowness? expandable segments + CUDA
# graphs + NCCL are known to hang, pytorch#158029; NCCL_GRAPH_REGISTER=0 the workaround named):
# each sample printed, a 20 s deadline, native stacks of every process at 12 s.
soak_expandable() {  # gpus port tag env...
  local gpus=$1 port=$2 tag=$3; shift 3
  env "$@" CUDA_VISIBLE_DEVICES=$gpus PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 75 \
      torchrun --nproc_per_node=2 --master_port $port benchmarks/diagnostics/soak.py --calls 10000 \
      --sample-every 100 --max-seconds 40 --out $R/soak_expandable_$tag.json > $G/soak_expandable_$tag.log 2>&1 &
  local job=$!
  sleep 12
  for pid in $(pgrep -f "soak.py.*soak_expandable_$tag.json"); do
    echo "== pid $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | head -c 200)"; timeout 30 py-spy dump --native --pid $pid
  done > $G/soak_expandable_${tag}_stacks.txt 2>&1
  wait $job; mark soak_expandable_$tag $?
}
RESTART=train-die-torchrun-cuda-restarts1
(
  for i in 1 2; do  # at once (torchrun --standalone picks its own port)
    ( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 110) python3 benchmarks/diagnostics/peer_death.py --matrix gpu \
        --only $RESTART --out $R/restart_$i.json > $G/restart_$i.log 2>&1; mark restart_$i $? ) &
  done
  wait
  soak_expandable 0,1 29965 a TOKENRING_XDIT_TIMEOUT=20
) &
( sweep new 2,3 2 1 29941 120; sweep old 2,3 2 2 29942 160; sweep new 2,3 2 3 29943 200; sweep old 2,3 2 4 29944 240
  soak_expandable 2,3 29966 b TOKENRING_XDIT_TIMEOUT=20 NCCL_GRAPH_REGISTER=0 ) &
wait
save
# Phase B (4 GPUs). Packed training graphs: exactness (ring 2 and 4; both layouts x cudnn and
# flash_varlen; replays equal eager, 2 captures per packing, the oldest packing dropped), then
# speed with a new packing per step through 8 layers (graphs on vs eager), by auto and by each
# layout with cuDNN, then the benchmark's --check (graphs vs eager vs fp64).
timeout $(lt 330) $PT tests/gpu/test_gpu_packed_graphs.py -s > $G/gpu_packed_graphs.log 2>&1; mark gpu_packed_graphs $?
save
timeout $(lt 420) torchrun --nproc_per_node=4 --master_port 29971 benchmarks/packed_varlen.py --real-ring --train-graph \
    --tokens 32768,131072 --layout auto --kernel auto --layers 8 --steps 4 --out $R/packed_graph_auto.json \
    > $G/packed_graph_auto.log 2>&1; mark packed_graph_auto $?
timeout $(lt 500) torchrun --nproc_per_node=4 --master_port 29972 benchmarks/packed_varlen.py --real-ring --train-graph \
    --tokens 32768 --layout zigzag,documents --kernel cudnn --layers 8 --steps 4 --out $R/packed_graph_layouts.json \
    > $G/packed_graph_layouts.log 2>&1; mark packed_graph_layouts $?
save
timeout $(lt 560) torchrun --nproc_per_node=4 --master_port 29973 benchmarks/packed_varlen.py --real-ring --train-graph \
    --tokens 32768 --layout zigzag,documents --kernel cudnn,flash_varlen --layers 4 --steps 2 --check --check-tokens 16384 \
    --out $R/packed_graph_check.json > $G/packed_graph_check.log 2>&1; mark packed_graph_check $?
save
# (h2's direct P2P path: its commands go here)
save
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
