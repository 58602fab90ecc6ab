#!/usr/bin/env bash
# Issue 42: where the host's time of a packed training call goes now that auto runs flash_varlen
# (32k tokens, ring 4, GQA 32/8 x 128, bf16): hot_path_host's timing and cProfile, each rank's
# full pstats kept (HOT_PATH_PSTATS), for auto (flash_varlen) and cuDNN per segment.
. docs/benchmarks/device_prelude.sh
for k in auto segments; do
  mkdir -p $R/pstats_$k
  HOT_PATH_PSTATS=$R/pstats_$k timeout $(lt $([ $k = auto ] && echo 100 || echo 200)) python3 benchmarks/diagnostics/hot_path_host.py \
      --path packed --ranks 4 --device cuda --kernel $k --repeats 100 --top 60 --out $R/host_$k.json > $G/host_$k.log 2>&1
  mark host_$k $?; save
done
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
