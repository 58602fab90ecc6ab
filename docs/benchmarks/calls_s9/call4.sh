#!/usr/bin/env bash
# Ninth session, call 4 (4 GPUs; from the repository root, $OUT set; carry .whl/base): the
# lanes' direct P2P issue (GPU test: direct = batch_isend_irecv, eager, replayed, packed; the
# packed call's host issue time direct / fallback alternated), then cuDNN per segment against
# flash_varlen in packed training with a new packing per step, 16 layers (call 3: a new
# packing's cuDNN plan builds cost cudnn ~100 ms per call at 4-8 layers).
. docs/benchmarks/device_prelude.sh
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
OFF=$PWD/tests/gpu/p2p_batch:$PYTHONPATH
timeout $(lt 90) $PT tests/gpu/test_gpu_p2p_direct.py > $G/gpu_p2p_direct.log 2>&1; mark gpu_p2p_direct $?
save
for i in 1 2; do
  timeout $(lt $((90 + 35 * i))) python3 benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --device cuda \
      --repeats 50 --top 40 --out $R/p2p_on_$i.json > $G/p2p_on_$i.log 2>&1; mark p2p_on_$i $?
  PYTHONPATH=$OFF timeout $(lt $((105 + 35 * i))) python3 benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 \
      --device cuda --repeats 50 --top 40 --out $R/p2p_off_$i.json > $G/p2p_off_$i.log 2>&1; mark p2p_off_$i $?
done
save
timeout $(lt 260) torchrun --nproc_per_node=4 --master_port 29981 benchmarks/packed_varlen.py --real-ring --train-graph \
    --tokens 32768,131072 --layout zigzag --kernel cudnn,flash_varlen --layers 16 --steps 3 --out $R/packed_kernels_16.json \
    > $G/packed_kernels_16.log 2>&1; mark packed_kernels_16 $?
save
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
