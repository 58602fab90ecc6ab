#!/usr/bin/env bash
# Seventh session, call 3 (4 GPUs, from the repository root, $OUT set; carry .whl/base and .old =
# `git archive afc6f22 tokenring_xdit benchmarks tests`): issue 44's GPU matrix with replays
# naming their step (GPUs 0,1) beside ring-2 inference new/old alternated and the IPC / graph /
# watchdog GPU tests (GPUs 2,3); then ring-4 inference new/old alternated (new without the
# ceiling probe between rows, as old). Every step bounded and saved as it ends.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; export PYTHONPATH=$SITE:$ROOT
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfE"
sweep() {  # who gpus nproc i port
  if [ $1 = new ]; then D=.; X=--no-ceiling; else D=.old; X=; fi
  ( cd $D && CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$SITE:$PWD timeout $(lt $6) torchrun --nproc_per_node=$3 --master_port $5 \
      benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 $X --out $R/sweep$3_$1_$4.json ) > $G/sweep$3_$1_$4.log 2>&1
  mark sweep$3_$1_$4 $?
}
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 300) $PT tests/gpu/test_gpu_peer_death.py > $G/peer_death.log 2>&1; mark peer_death $? ) &
( sweep new 2,3 2 1 29821 150; sweep old 2,3 2 2 29822 150; sweep new 2,3 2 3 29823 150; sweep old 2,3 2 4 29824 150
  ( CUDA_VISIBLE_DEVICES=2 timeout $(lt 295) $PT tests/gpu/test_gpu_ipc_ring.py tests/gpu/test_gpu_ipc.py tests/gpu/test_gpu_watchdog.py tests/gpu/test_gpu_graph_cache.py > $G/ipc_graph.log 2>&1; mark ipc_graph $? ) &
  CUDA_VISIBLE_DEVICES=3 timeout $(lt 295) $PT tests/gpu/test_gpu_token_ring.py > $G/token_ring.log 2>&1; mark token_ring $?; wait ) &
wait; save
for i in 1 2 3 4; do if [ $((i % 2)) = 1 ]; then sweep new 0,1,2,3 4 $i $((29830 + i)) $((300 + i * 40)); else sweep old 0,1,2,3 4 $i $((29830 + i)) $((300 + i * 40)); fi; done
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
