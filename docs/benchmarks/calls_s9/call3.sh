#!/usr/bin/env bash
# Ninth session, call 3 (4 GPUs; from the repository root, $OUT set; carry .whl/base, .whl/diag
# and .old = `git archive c9d636a tokenring_xdit benchmarks tests`, before the eighth session's
# watchdog change). Phase A, two GPU pairs at once: (0,1) the torchrun restart scenario twice
# with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, then the soak under expandable segments with each
# sample printed and native stacks at 40 s (it did not finish 10^4 calls in 540 s, call 2);
# (2,3) ring-2 inference new / old alternated (the watchdog now reuses its events).
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
RESTART=train-die-torchrun-cuda-restarts1
(
  for i in 1 2; do  # at once (torchrun --standalone picks its own port)
    ( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 110) python3 benchmarks/diagnostics/peer_death.py --matrix gpu \
        --only $RESTART --out $R/restart_$i.json > $G/restart_$i.log 2>&1; mark restart_$i $? ) &
  done
  wait
  CUDA_VISIBLE_DEVICES=0,1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(lt 200) torchrun --nproc_per_node=2 \
      --master_port 29965 benchmarks/diagnostics/soak.py --calls 10000 --sample-every 100 --max-seconds 45 \
      --out $R/soak_expandable.json > $G/soak_expandable.log 2>&1 &
  sleep 30
  for pid in $(pgrep -f diagnostics/soak.py); do
    echo "== pid $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | head -c 200)"; timeout 30 py-spy dump --native --pid $pid
  done > $G/soak_expandable_stacks.txt 2>&1
  wait; mark soak_expandable $?
) &
( sweep new 2,3 2 1 29941 120; sweep old 2,3 2 2 29942 160; sweep new 2,3 2 3 29943 200; sweep old 2,3 2 4 29944 240 ) &
wait
save
# Phase B (4 GPUs): helpers' commands go here
save
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
