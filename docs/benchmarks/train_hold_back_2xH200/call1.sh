#!/usr/bin/env bash
# Issue 41 items 2-3 at ring 2 (2 x H200): the held-back own block (TOKENRING_XDIT_TRAIN_HOLD_BACK,
# ring/diagonal.py) off/on alternating per shape in one run, ring 2's in-place forward merge
# (always on) new vs old, ulysses in the same runs, and one training call profiled per rank.
# Old = tokenring_xdit at afc6f22 in .old/ (git archive afc6f22 tokenring_xdit | tar -x -C .old),
# run by the NEW scripts (they fall back where the old package lacks train_hold_back).
# Run from the repository root with $OUT set; about 5 minutes.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; L=$OUT/log.txt; G=$OUT/logs; mkdir -p $G
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
nvidia-smi --query-gpu=name --format=csv,noheader >> $L
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())" >> $L
run() { # code(old|new) tag port script args...
  local code=$1 tag=$2 port=$3; shift 3
  local pkg=$ROOT; [ $code = old ] && pkg=$ROOT/.old
  PYTHONPATH=$SITE:$pkg timeout $(left 330) torchrun --nproc_per_node=2 --master_port $port "$@" > $G/$tag.log 2>&1; mark $tag $?
}
S="--seqs 16384,32768 --warmup 3 --iters 10"
# the shapes (causal GQA 32/8, non-causal MHA 32) + its ulysses (all-to-all + cuDNN)
run new mnt_new 29711 benchmarks/multi_node_train.py --methods token_ring,token_ring_hold_back,ulysses $S --check --out $OUT/mnt_new.json
run old mnt_old 29712 benchmarks/multi_node_train.py --methods token_ring,ulysses $S --out $OUT/mnt_old.json
# train_sweep (MHA 32 and 64 heads, both masks; its ulysses is yunchang's)
run new ts_new 29713 benchmarks/train_sweep.py --methods token_ring,token_ring_hold_back,ulysses $S --check --out $OUT/ts_new.json
run old ts_old 29714 benchmarks/train_sweep.py --methods token_ring,ulysses $S --out $OUT/ts_old.json
# one training call per rank: timeline, kernels-only ceiling, whole-sequence cuDNN / 2
run new prof_new 29715 benchmarks/profile_train_call.py --seqs 16384 --hold-back 0 1 --out $OUT/profile_new.json
run old prof_old 29716 benchmarks/profile_train_call.py --seqs 16384 --hold-back 0 --out $OUT/profile_old.json
# the split's compute cost alone (one GPU, transfers free): replay with train_hold_back off / on
PYTHONPATH=$SITE:$ROOT timeout $(left 320) python3 benchmarks/replay_rank.py --rings 2,4 --tokens 4096,8192 --hold-back --no-whole --iters 5 --out $OUT/replay_hold_back.json > $G/replay.log 2>&1; mark replay $?
# exactness of the split on one GPU (cuDNN / torch flash on head slices), vs the unsplit loop
PYTHONPATH=$SITE:$ROOT timeout $(left 350) python3 -m pytest -q -m gpu tests/gpu/test_gpu_training.py -k held_back > $G/gpu_test.log 2>&1; mark gpu_test $?
# a second new/old pair of the main comparison if time is left (drift check)
[ $(left 340) -gt 60 ] && run old mnt_old2 29717 benchmarks/multi_node_train.py --methods token_ring,ulysses $S --out $OUT/mnt_old2.json
[ $(left 340) -gt 60 ] && run new mnt_new2 29718 benchmarks/multi_node_train.py --methods token_ring,token_ring_hold_back,ulysses $S --out $OUT/mnt_new2.json
grep -h "ideal 100%" $G/prof_*.log >> $L
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L
echo "done t=$(( $(date +%s) - T0 ))" >> $L
