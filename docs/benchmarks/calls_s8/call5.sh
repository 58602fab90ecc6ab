#!/usr/bin/env bash
# Call 5 (eighth session): issue 42 - the packed call's host cut (h3), new / old alternated on 4
# GPUs (old = .old, git archive d5bd76c), the real ring with per-rank profiles and the host issue
# time alone (hot_path_host --device cuda); issue 44 item 2 - the soak, as is and with
# expandable segments.
. docs/benchmarks/device_prelude.sh
PK="benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 --layout auto --kernel auto --warmup 3 --iters 10 --profile 3"
HP="benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --device cuda --repeats 50 --top 40"
ROOT=$PWD
for i in 1 2; do
  for v in new old; do
    PP=$ROOT; [ $v = old ] && PP=$ROOT/.old
    (cd $PP && PYTHONPATH=$PP:$ROOT/.site timeout $(lt $((i*130))) torchrun --nproc_per_node=4 --master_port 2991$i $PK \
       --out $R/packed4_${v}_$i.json) > $G/packed4_${v}_$i.log 2>&1; mark packed4_${v}_$i $?
  done
done; save
for v in new old; do
  PP=$ROOT; [ $v = old ] && PP=$ROOT/.old
  PYTHONPATH=$PP:$ROOT/.site:$ROOT timeout $(lt 330) python3 $HP --label $v --out $R/packed_host_gpu_$v.json > $G/packed_host_$v.log 2>&1
  mark packed_host_$v $?
done; save
# issue 44 item 2: the soak, 2 x 10^4 calls, as is (GPUs 0,1) and with expandable segments (GPUs 2,3)
P1=$(( $(date +%s) - T0 ))
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt $((P1+150))) torchrun --nproc_per_node=2 --master_port 29901 benchmarks/diagnostics/soak.py \
     --calls 20000 --out $R/soak_default.json > $G/soak_default.log 2>&1; mark soak_default $? ) &
( CUDA_VISIBLE_DEVICES=2,3 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(lt $((P1+150))) torchrun --nproc_per_node=2 \
     --master_port 29902 benchmarks/diagnostics/soak.py --calls 20000 --out $R/soak_expandable.json > $G/soak_expandable.log 2>&1; mark soak_expandable $? ) &
wait
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L; save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
