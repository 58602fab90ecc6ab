#!/usr/bin/env bash
# Call D: issue 44 exit diagnosis (SIGABRT at exit after the named error) + packed fix check;
# no-host-sync check; GPU packed tests (4 GPUs).
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/resd; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader >> $L
PD="python3 benchmarks/diagnostics/peer_death.py --launcher plain --deadline 8"
one() { # gpus name path fault env...
  local gp=$1 nm=$2 p=$3 f=$4; shift 4; local e=(--env PYTHONFAULTHANDLER=1); for x in "$@"; do e+=(--env "$x"); done
  CUDA_VISIBLE_DEVICES=$gp timeout $(lt 200) $PD --path $p --fault $f "${e[@]}" --out $R/pd_$nm.json > $G/pd_$nm.log 2>&1; mark pd_$nm $?; }
# phase 1 (GPUs 0,1 and 2,3): variants of the exit after the error
one 0,1 train_die_a train die &
one 0,1 train_die_b train die PEER_EXIT_PREP=threads &
one 0,1 train_die_sleep train die PEER_EXIT_PREP=sleep3 &
one 0,1 train_die_sync train die PEER_EXIT_PREP=sync &
one 0,1 train_die_destroy train die PEER_EXIT_PREP=destroy &
one 0,1 train_die_leak train die PEER_EXIT_PREP=leak &
one 2,3 train_raise_a train raise_exit &
one 2,3 train_raise_leak train raise_exit PEER_EXIT_PREP=leak &
one 2,3 graphed_die_a infer_graphed die &
one 2,3 train_die_cpplog train die TORCH_CPP_LOG_LEVEL=INFO &
one 2,3 packed_die packed die &
one 2,3 packed_hang packed hang &
wait; save
# phase 2: host syncs on GPUs 0,1 || GPU packed tests need 4: run after
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 330) torchrun --nproc_per_node=2 --master_port 29790 benchmarks/diagnostics/host_sync.py --out $R/host_sync.json > $G/host_sync.log 2>&1; mark host_sync $?
save
timeout $(lt 470) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gpu_packed.py > $G/gpu_packed.log 2>&1; mark gpu_packed $?
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
