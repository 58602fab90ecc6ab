#!/usr/bin/env bash
# Call E: issue 44 after the fixes (packed offsets copy never blocks; a failed ring's aborted groups kept to exit):
# the GPU peer-fault matrix twice at once, on GPUs 0,1 and 2,3.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/rese; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
git log --oneline -1 >> $L 2>&1
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 200) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 7 --budget 120 --out $R/peer_death_gpu_b.json > $G/pd_b.log 2>&1; mark matrix_b $? ) &
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 200) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 7 --budget 120 --out $R/peer_death_gpu_a.json > $G/pd_a.log 2>&1; mark matrix_a $?
wait
for x in a b; do python3 benchmarks/diagnostics/peer_death.py --table $R/peer_death_gpu_$x.json > $R/peer_death_gpu_${x}_table.md 2>>$L; done
save; cat $R/peer_death_gpu_a_table.md $R/peer_death_gpu_b_table.md >> $L; echo "done t=$(( $(date +%s) - T0 ))" >> $L
