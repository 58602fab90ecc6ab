#!/usr/bin/env bash
# Issue 42, the contiguous layout (tenth session, call 5; 4 GPUs): exactness on GPU (--check,
# bf16 vs fp64 per document) and time beside the row's zigzag, ring 4 at 32k and 128k, the
# documents as drawn and packed in each layout's balanced order, flash_varlen and cuDNN per
# segment; with a per-rank profile of the contiguous runs; ring 2; training with a new packing
# per step (16 layers, eager and graphed).
. docs/benchmarks/device_prelude.sh
PV="benchmarks/packed_varlen.py --real-ring"
TR="torchrun --nproc_per_node=4"
timeout $(lt 150) $TR --master_port 29971 $PV --tokens 32768,131072 --layout zigzag,contiguous --kernel flash_varlen,cudnn \
    --check --order balanced-contiguous --profile 5 --warmup 3 --iters 10 --out $R/ring4_bc.json > $G/ring4_bc.log 2>&1
mark ring4_bc $?; save
for o in packed balanced; do
  timeout $(lt $([ $o = packed ] && echo 220 || echo 290)) $TR --master_port 29972 $PV --tokens 32768,131072 \
      --layout zigzag,contiguous --kernel flash_varlen,cudnn --order $o --warmup 3 --iters 10 --out $R/ring4_$o.json > $G/ring4_$o.log 2>&1
  mark ring4_$o $?; save
done
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 350) torchrun --nproc_per_node=2 --master_port 29973 $PV --tokens 32768,131072 \
    --layout zigzag,contiguous --kernel flash_varlen,cudnn --order balanced-contiguous --warmup 3 --iters 10 \
    --out $R/ring2_bc.json > $G/ring2_bc.log 2>&1
mark ring2_bc $?; save
timeout $(lt 470) $TR --master_port 29974 $PV --train-graph --tokens 32768,131072 --layout zigzag,contiguous \
    --kernel flash_varlen --order balanced-contiguous --layers 16 --steps 3 --out $R/train_bc.json > $G/train_bc.log 2>&1
mark train_bc $?; save
for f in $G/*.log; do echo "## $f"; grep -v "^W1\|^\*\*\*\|OMP_NUM\|UserWarning\|return func" $f | tail -n 16; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
