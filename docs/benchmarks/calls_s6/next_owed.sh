#!/usr/bin/env bash
# The runs the sixth session owes, for the next 4-GPU lease (from the repository root, $OUT set;
# carry .whl/base and .old = `git archive afc6f22 tokenring_xdit benchmarks tests`). Two calls:
# `bash next_owed.sh 1` (~8 min: issue 44's GPU tests beside the compiled packed test, then the
# eager sweep alternated) and `bash next_owed.sh 2` (~5 min: packed real rings). Every step is
# bounded and saved as it ends. FA4's rerun needs its three-part install (call_a/b/c.sh).
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; export PYTHONPATH=$SITE:$ROOT
PT="python3 -m pytest -m gpu -q -p no:cacheprovider -rfE"
if [ "${1:-1}" = 1 ]; then
  # issue 44 (GPUs 0,1) || issue 42's compiled packed test (GPU 2)
  ( CUDA_VISIBLE_DEVICES=2 timeout $(lt 300) $PT tests/gpu/test_gpu_compile_packed.py > $G/compile_packed.log 2>&1; mark compile_packed $? ) &
  CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 330) $PT tests/gpu/test_gpu_peer_death.py tests/gpu/test_gpu_no_host_sync.py > $G/peer_death.log 2>&1; mark peer_death $?
  wait; save
  # issue 41 item 8: the eager gap, new / old alternated
  for i in 1 2 3 4; do
    if [ $((i % 2)) = 1 ]; then who=new; D=.; else who=old; D=.old; fi
    ( cd $D && PYTHONPATH=$SITE:$PWD timeout $(lt $((360 + i * 35))) torchrun --nproc_per_node=4 --master_port $((29810 + i)) \
        benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep4_${who}_$i.json ) > $G/sweep4_${who}_$i.log 2>&1
    mark sweep4_${who}_$i $?
  done
else
  # issue 42: packed real rings with cuDNN per segment, the balanced packing order, long documents
  S="--real-ring --warmup 3 --iters 10"
  timeout $(lt 120) torchrun --nproc_per_node=4 --master_port 29801 benchmarks/packed_varlen.py $S --tokens 32768,131072 --layout zigzag,documents --kernel cudnn --check --out $R/packed_ring_4gpu_cudnn.json > $G/packed_cudnn.log 2>&1; mark packed_cudnn $?
  timeout $(lt 210) torchrun --nproc_per_node=4 --master_port 29802 benchmarks/packed_varlen.py $S --tokens 32768,131072 --layout zigzag --order balanced --check --out $R/packed_ring_4gpu_ordered.json > $G/packed_ordered.log 2>&1; mark packed_ordered $?
  timeout $(lt 300) torchrun --nproc_per_node=4 --master_port 29803 benchmarks/packed_varlen.py $S --tokens 65536,131072 --doc-lens 16384,65536 --layout zigzag,documents,auto --out $R/packed_ring_4gpu_long.json > $G/packed_long.log 2>&1; mark packed_long $?
fi
for f in $G/*.log; do echo "## $f"; tail -n 5 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
