#!/usr/bin/env bash
# Seventh session, call 4 (4 GPUs; carry .whl/base and .old = `git archive afc6f22 tokenring_xdit
# benchmarks tests`): issue 44's GPU matrix after the graph-release fix (GPUs 0,1) beside the
# watchdog/graph GPU tests and ring-2 inference (new default / old alternated, then new with the
# replay step marks on) on GPUs 2,3; then ring 4 the same way on all four.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; export PYTHONPATH=$SITE:$ROOT
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfE"
sweep() {  # who gpus nproc tag port limit
  local D=. X=--no-ceiling M=0
  [ $1 = old ] && { D=.old; X=; }
  [ $1 = marks ] && M=1
  ( cd $D && TOKENRING_XDIT_REPLAY_STEP_MARKS=$M CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$SITE:$PWD timeout $(lt $6) torchrun --nproc_per_node=$3 --master_port $5 \
      benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 $X --out $R/sweep$3_$1_$4.json ) > $G/sweep$3_$1_$4.log 2>&1
  mark sweep$3_$1_$4 $?
}
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 310) $PT tests/gpu/test_gpu_peer_death.py > $G/peer_death.log 2>&1; mark peer_death $? ) &
( CUDA_VISIBLE_DEVICES=2 timeout $(lt 60) $PT tests/gpu/test_gpu_watchdog.py > $G/watchdog.log 2>&1; mark watchdog $?
  sweep new 2,3 2 1 29841 150; sweep old 2,3 2 2 29842 150; sweep new 2,3 2 3 29843 150; sweep old 2,3 2 4 29844 150
  sweep marks 2,3 2 5 29845 300 ) &
wait; save
sweep new 0,1,2,3 4 1 29851 350; sweep old 0,1,2,3 4 2 29852 385; sweep new 0,1,2,3 4 3 29853 420; sweep old 0,1,2,3 4 4 29854 455
sweep marks 0,1,2,3 4 5 29855 490
for f in $G/peer_death.log $G/watchdog.log; do echo "## $f"; tail -n 12 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
