#!/usr/bin/env bash
# Eleventh session, call 4 (2 GPUs): a lane post's host time at the real call's sizes (64 MiB), with the
# watchdog running, and each post of the real packed call timed (hot_path_host --time-posts).
. docs/benchmarks/device_prelude.sh
timeout $(lt 100) torchrun --nproc_per_node=2 --master_port 29971 \
    benchmarks/diagnostics/p2p_issue.py --label big --modes lane,watched,bundle --tensors 1,2,4 \
    --bytes 65536,67108864 --out $R/p2p_big.json > $G/p2p_big.log 2>&1
mark p2p_big $?; save
for l in contiguous zigzag; do
  timeout $(lt $([ $l = contiguous ] && echo 170 || echo 240)) python3 benchmarks/diagnostics/hot_path_host.py --path packed \
      --ranks 2 --device cuda --kernel auto --layout $l --repeats 30 --top 30 --time-posts --out $R/posts_$l.json > $G/posts_$l.log 2>&1
  mark posts_$l $?; save
done
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
