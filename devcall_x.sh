#!/usr/bin/env bash
# Issue 42, the contiguous layout with trimmed queries (tenth session, call 6; 4 GPUs): a
# travelling query carries only the rows later holders attend (the crossing document's prefix);
# exactness (--check) and time beside the zigzag at ring 4 (per-rank profile) and ring 2, and
# training with a new packing per step (16 layers).
. docs/benchmarks/device_prelude.sh
PV="benchmarks/packed_varlen.py --real-ring"
TR="torchrun --nproc_per_node=4"
timeout $(lt 150) $TR --master_port 29961 $PV --tokens 32768,131072 --layout zigzag,contiguous --kernel flash_varlen,cudnn \
    --check --order balanced-contiguous --profile 5 --warmup 3 --iters 10 --out $R/ring4_bc.json > $G/ring4_bc.log 2>&1
mark ring4_bc $?; save
timeout $(lt 200) $TR --master_port 29962 $PV --tokens 32768,131072 --layout zigzag,contiguous --kernel flash_varlen,cudnn \
    --order packed --warmup 3 --iters 10 --out $R/ring4_packed.json > $G/ring4_packed.log 2>&1
mark ring4_packed $?; save
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 250) torchrun --nproc_per_node=2 --master_port 29963 $PV --tokens 32768,131072 \
    --layout zigzag,contiguous --kernel flash_varlen,cudnn --order balanced-contiguous --warmup 3 --iters 10 \
    --out $R/ring2_bc.json > $G/ring2_bc.log 2>&1
mark ring2_bc $?; save
timeout $(lt 320) $TR --master_port 29964 $PV --train-graph --tokens 32768,131072 --layout zigzag,contiguous \
    --kernel flash_varlen --order balanced-contiguous --layers 16 --steps 3 --out $R/train_bc.json > $G/train_bc.log 2>&1
mark train_bc $?; save
for f in $G/*.log; do echo "## $f"; grep -v "^W1\|^\*\*\*\|OMP_NUM\|UserWarning\|return func\|_warn_once\|run_backward\|Guessing" $f | tail -n 42; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
