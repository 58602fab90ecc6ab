#!/usr/bin/env bash
# Repro of call 1's ipc-hang-plain-cuda-marks failure (rank 0 blocked in its first cuDNN forward
# at call 0, before the fault): the ipc scenario again and again, native stacks at the wall;
# GPUs 0,1 as users run it (lazy module loading), GPUs 2,3 with CUDA_MODULE_LOADING=EAGER.
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
loop() {  # name, gpus, extra env
  local i=0
  while [ $(left 300) -gt 45 ]; do
    i=$((i+1))
    CUDA_VISIBLE_DEVICES=$2 timeout 60 python3 benchmarks/diagnostics/peer_death.py --path ipc --fault hang \
      --fault-at 3 --calls 40 --wall 40 --env TOKENRING_XDIT_REPLAY_STEP_MARKS=1 $3 \
      --out $R/$1_$i.json > $G/$1_$i.log 2>&1
    mark "$1_$i" $?
    python3 - $R/$1_$i.json >> $L <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("  problems:", r.get("problems"), "timeline:", r.get("timeline"))
PY
  done
}
loop lazy 0,1 "" &
loop eager 2,3 "--env CUDA_MODULE_LOADING=EAGER" &
wait
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
