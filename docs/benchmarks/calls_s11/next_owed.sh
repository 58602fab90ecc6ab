#!/usr/bin/env bash
# What the eleventh session would have run on 4 GPUs (from the repository root, $OUT set; carry
# .whl/base), ~2 minutes: is ring 4's packed call GPU-bound with cuDNN per segment too? The
# tenth session's --train-graph run (flash_varlen) replayed a captured packing in 6.80 ms against
# 6.82 eager; this runs the same with cuDNN per segment (the 6.24 ms of the table) beside it.
. docs/benchmarks/device_prelude.sh
timeout $(lt 200) torchrun --nproc_per_node=4 --master_port 29981 benchmarks/packed_varlen.py \
    --real-ring --train-graph --tokens 32768 --layout contiguous --kernel cudnn,flash_varlen \
    --order packed --layers 16 --steps 3 --out $R/ring4_train_cudnn.json > $G/ring4_train_cudnn.log 2>&1
mark ring4_train_cudnn $?; save
tail -n 8 $G/ring4_train_cudnn.log >> $L
