#!/usr/bin/env bash
# Call 2 (eighth session): issue 42 packed profiles + the blockwise API test (4 GPUs), then
# issue 44's stuck graph-replay scenarios with exit steps (2 GPU pairs). (py-spy was installed
# into .site without --upgrade here, so its binary was not on PATH: no native stacks this call.)
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
which py-spy >> $L 2>&1
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
timeout $(lt 100) torchrun --nproc_per_node=4 --master_port 29881 benchmarks/packed_varlen.py --real-ring --tokens 32768 \
   --layout zigzag,auto --kernel auto,flash_varlen --warmup 3 --iters 10 --profile 5 --profile-events \
   --out $R/packed_profile_ring4_32k.json > $G/packed_profile4.log 2>&1; mark packed_profile4 $?; save
timeout $(lt 160) $PT tests/gpu/test_gpu_packed.py -k public_api -s > $G/packed_api4.log 2>&1; mark packed_api4 $?; save
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 230) torchrun --nproc_per_node=2 --master_port 29882 benchmarks/packed_varlen.py --real-ring \
   --tokens 32768 --layout auto --kernel auto --warmup 3 --iters 10 --profile 5 --profile-events \
   --out $R/packed_profile_ring2_32k.json > $G/packed_profile2.log 2>&1; mark packed_profile2 $? ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 230) $PT tests/gpu/test_gpu_packed.py -k public_api -s > $G/packed_api2.log 2>&1; mark packed_api2 $? ) &
wait; save
P0=$(( $(date +%s) - T0 ))
# issue 44 part of call 2 (sourced after the prelude): GPUs 0,1 the stuck scenarios as the user
# gets them (native stacks at the wall); GPUs 2,3 the two hang replays with exit steps
XF=infer_graphed-hang-plain-cuda,infer_graphed-raise_exit-plain-cuda,infer_graphed-raise_stay-plain-cuda,infer_graphed-die-plain-cuda-continue,infer_graphed-hang-plain-cuda-grouptimeout,infer_graphed-hang-torchrun-cuda,infer_graphed-hang-plain-cuda-peers-only
HX=infer_graphed-hang-plain-cuda,infer_graphed-hang-plain-cuda-peers-only
PD="python3 benchmarks/diagnostics/peer_death.py --matrix gpu"
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt $((P0+200))) $PD --only $XF --jobs 7 --out $R/peer_xfail.json > $G/peer_xfail.log 2>&1; mark peer_xfail $? ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt $((P0+100))) $PD --only $HX --jobs 2 --env PEER_EXIT_PREP=query,threads,destroy,query \
      --out $R/peer_exit_destroy.json > $G/peer_exit_destroy.log 2>&1; mark peer_exit_destroy $?
  CUDA_VISIBLE_DEVICES=2,3 timeout $(lt $((P0+200))) $PD --only $HX --jobs 2 --env PEER_EXIT_PREP=query,abort,query \
      --out $R/peer_exit_abort.json > $G/peer_exit_abort.log 2>&1; mark peer_exit_abort $? ) &
wait; save
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L; save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
