#!/usr/bin/env bash
# The runs the ninth session owes (4 GPUs; from the repository root, $OUT set; carry .whl/base
# and .whl/diag), one call of about 8 minutes, every step bounded and saved:
# - issue 44: the whole GPU peer matrix (tests/gpu/test_gpu_peer_death.py with the watchdog and
#   exit tests) after this session's two changes on the failure path: the watchdog reuses its
#   CUDA events, and the lanes issue NCCL P2P straight on the process group (a failed batch is
#   closed); then the soak with the held-memory verdict, 2 x 10^4 calls;
# - issue 42: `auto` on packed rows now prices cuDNN's plan builds of a new packing and picks
#   flash_varlen on rows of many documents: --check through it at ring 4, and its time with a new
#   packing per step next to cuDNN per segment (16 layers).
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 420) $PT tests/gpu/test_gpu_peer_death.py tests/gpu/test_gpu_watchdog.py \
      tests/gpu/test_gpu_exit.py > $G/peer_death.log 2>&1; mark peer_death $? ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 120) torchrun --nproc_per_node=2 --master_port 29991 benchmarks/diagnostics/soak.py \
      --calls 20000 --out $R/soak_default.json > $G/soak_default.log 2>&1; mark soak_default $? ) &
wait
save
timeout $(lt 520) torchrun --nproc_per_node=4 --master_port 29992 benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 \
    --layout auto --kernel auto --check --warmup 3 --iters 10 --out $R/packed_ring4_auto_check.json > $G/packed_check.log 2>&1
mark packed_check $?
timeout $(lt 600) torchrun --nproc_per_node=4 --master_port 29993 benchmarks/packed_varlen.py --real-ring --train-graph \
    --tokens 32768,131072 --layout auto --kernel auto,cudnn --layers 16 --steps 3 --out $R/packed_new_packing.json \
    > $G/packed_new_packing.log 2>&1; mark packed_new_packing $?
save
for f in $G/*.log; do echo "## $f"; tail -n 8 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
