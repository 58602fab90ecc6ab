#!/usr/bin/env bash
# Eleventh session, call 3: where a lane post's host time goes (p2p_issue.py, env variants),
# native stacks of the packed call's host issue (py-spy).
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
P=29961
run() { label=$1; shift; P=$((P+1))
  env "$@" CUDA_VISIBLE_DEVICES=0,1,2,3 timeout $(lt $LIM) torchrun --nproc_per_node=4 --master_port $P \
    benchmarks/diagnostics/p2p_issue.py --label $label $MODES --out $R/p2p_$label.json > $G/p2p_$label.log 2>&1
  mark p2p_$label $?; save; }
LIM=120 MODES=""; run default
MODES="--modes lane,phases --bytes 65536"
LIM=160; run fr0 TORCH_NCCL_TRACE_BUFFER_SIZE=0
LIM=200; run mix0 NCCL_GRAPH_MIXING_SUPPORT=0
LIM=240; run fr0mix0 TORCH_NCCL_TRACE_BUFFER_SIZE=0 NCCL_GRAPH_MIXING_SUPPORT=0
LIM=280; run launch_group NCCL_LAUNCH_MODE=GROUP
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout $(lt 400) py-spy record --native --subprocesses --rate 400 -f raw -o $R/hot_raw.txt -- \
  python3 benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --device cuda --kernel auto --layout contiguous \
  --repeats 50 --top 20 --out $R/host_spy.json > $G/host_spy.log 2>&1
mark host_spy $?; save
for f in $G/p2p_default.log; do tail -n 30 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
