#!/usr/bin/env bash
# The runs the eighth session owes, for the next lease of 4 GPUs (from the repository root, $OUT
# set; carry .whl/base and .old = `git archive c9d636a tokenring_xdit benchmarks tests`, the code
# before the eighth session's watchdog change), in two calls: `next_owed.sh 1` (about 9 minutes)
# and `next_owed.sh 2` (about 5), every step bounded and saved:
# - issue 42: the packed wrappers' host-work cut (covered rows start uninitialised, segments cut
#   from (b, h, s, d) views) was measured for speed on GPU but its exactness only on CPU:
#   tests/gpu/test_gpu_packed.py in full, then `--check` through auto at ring 4; the host profile
#   of the real row again (hot_path_host now warms the profiling thread's cuDNN plans first);
# - issue 44: the GPU peer tests (pytest, XFAIL now empty) and the watchdog/exit tests; the
#   watchdog change touches every NCCL call (watch() clears a list): inference new / old
#   alternated at ring 2 (GPUs 2,3; call 1) and ring 4 (call 2); the soak again with what the
#   allocator's pool is made of, and with expandable segments given time (call 2).
. docs/benchmarks/device_prelude.sh  # lt, mark, save, the wheels, the environment
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX"
SITE=$PWD/.site; ROOT=$PWD
sweep() {  # who gpus nproc tag port limit
  local D=$ROOT
  [ $1 = old ] && D=$ROOT/.old
  ( cd $D && CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$SITE:$D timeout $(lt $6) torchrun --nproc_per_node=$3 --master_port $5 \
      benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep$3_$1_$4.json ) > $G/sweep$3_$1_$4.log 2>&1
  mark sweep$3_$1_$4 $?
}
if [ "${1:-1}" = 1 ]; then
  timeout $(lt 150) $PT tests/gpu/test_gpu_packed.py > $G/gpu_packed.log 2>&1; mark gpu_packed $?; save
  timeout $(lt 200) torchrun --nproc_per_node=4 --master_port 29931 benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 \
      --layout auto --kernel auto --check --warmup 3 --iters 10 --out $R/packed_ring4_auto_check.json > $G/packed_check.log 2>&1
  mark packed_check $?
  timeout $(lt 240) python3 benchmarks/diagnostics/hot_path_host.py --path packed --ranks 4 --device cuda --repeats 50 --top 40 \
      --out $R/packed_host_gpu.json > $G/packed_host.log 2>&1; mark packed_host $?; save
  ( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 560) $PT tests/gpu/test_gpu_peer_death.py tests/gpu/test_gpu_watchdog.py \
        tests/gpu/test_gpu_exit.py > $G/peer_death.log 2>&1; mark peer_death $? ) &
  ( sweep new 2,3 2 1 29941 300; sweep old 2,3 2 2 29942 350; sweep new 2,3 2 3 29943 400; sweep old 2,3 2 4 29944 450 ) &
  wait
else
  sweep new 0,1,2,3 4 1 29951 60; sweep old 0,1,2,3 4 2 29952 120; sweep new 0,1,2,3 4 3 29953 180; sweep old 0,1,2,3 4 4 29954 240
  save
  # the soak with the allocator pool's make-up per sample and after empty_cache (soak.py's
  # POOL_STATS), as is (GPUs 2,3) and with expandable segments (GPUs 0,1)
  ( CUDA_VISIBLE_DEVICES=0,1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $(lt 540) torchrun --nproc_per_node=2 \
      --master_port 29955 benchmarks/diagnostics/soak.py --calls 10000 --out $R/soak_expandable.json > $G/soak_expandable.log 2>&1
    mark soak_expandable $? ) &
  ( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 400) torchrun --nproc_per_node=2 --master_port 29956 benchmarks/diagnostics/soak.py \
      --calls 20000 --out $R/soak_default.json > $G/soak_default.log 2>&1; mark soak_default $? ) &
  wait
fi
save
for f in $G/*.log; do echo "## $f"; tail -n 8 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
