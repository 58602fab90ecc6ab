#!/usr/bin/env bash
# What the tenth session owes the next lease of 4 GPUs (from the repository root, $OUT set;
# carry .whl/base and .whl/diag), one call of about 8 minutes, every step bounded and saved:
# - issue 42's contiguous layout where the tenth session could not run it: the packed GPU tests
#   whole (the thread ring with the contiguous layout passed on one H200; the NCCL API test,
#   packed training graphs and compiled packed calls, where auto now picks contiguous shards on
#   rows of many documents), ring 2 with a new packing per step (16 layers), and the packed
#   call's host issue time on GPU per layout (hot_path_host --layout);
# - issue 44's one unexplained failure: the IPC scenario again and again with py-spy on PATH
#   (the GPU peer test now prints the native stacks of a rank stuck at its wall).
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 330) $PT tests/gpu/test_gpu_packed.py tests/gpu/test_gpu_packed_graphs.py \
      tests/gpu/test_gpu_compile_packed.py > $G/gpu_packed.log 2>&1; mark gpu_packed $? ) &
( i=0; while [ $(left 330) -gt 45 ]; do i=$((i+1))
    CUDA_VISIBLE_DEVICES=2,3 timeout 60 python3 benchmarks/diagnostics/peer_death.py --path ipc --fault hang \
        --fault-at 3 --calls 40 --wall 40 --env TOKENRING_XDIT_REPLAY_STEP_MARKS=1 --out $R/ipc_$i.json > $G/ipc_$i.log 2>&1
    mark ipc_$i $?; done ) &
wait
save
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 430) torchrun --nproc_per_node=2 --master_port 29951 benchmarks/packed_varlen.py \
    --real-ring --train-graph --tokens 32768,131072 --layout zigzag,contiguous --kernel flash_varlen \
    --order balanced-contiguous --layers 16 --steps 3 --out $R/ring2_train.json > $G/ring2_train.log 2>&1
mark ring2_train $?; save
for l in contiguous zigzag; do
  timeout $(lt $([ $l = contiguous ] && echo 470 || echo 510)) python3 benchmarks/diagnostics/hot_path_host.py --path packed \
      --ranks 4 --device cuda --kernel auto --layout $l --repeats 50 --top 40 --out $R/host_$l.json > $G/host_$l.log 2>&1
  mark host_$l $?; save
done
for f in $G/gpu_packed.log $G/ring2_train.log; do echo "## $f"; tail -n 12 $f; done >> $L
grep -l '"problems": \[\]' $R/ipc_*.json | wc -l >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
