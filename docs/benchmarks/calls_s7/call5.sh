#!/usr/bin/env bash
# Seventh session, call 5 (4 GPUs; carry .whl/base): the training call graphed (issue 41 item 3:
# token_ring vs token_ring_graph vs ulysses, exact vs fp64 with --check) and packed documents
# with auto's (layout, kernel) pick beside each named kernel (issue 42). Bounded to ~240 s.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD
timeout $(lt 95) torchrun --nproc_per_node=4 --master_port 29861 benchmarks/multi_node_train.py --methods token_ring,token_ring_graph,ulysses --seqs 16384,32768 --warmup 3 --iters 10 --check --out $R/train_graph_ring4.json > $G/train_graph.log 2>&1; mark train_graph $?; save
timeout $(lt 175) torchrun --nproc_per_node=4 --master_port 29862 benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 --layout zigzag,auto --kernel flash_varlen,cudnn,auto --warmup 3 --iters 10 --out $R/packed_ring_4gpu_kernels.json > $G/packed_kernels.log 2>&1; mark packed_kernels $?; save
timeout $(lt 235) torchrun --nproc_per_node=4 --master_port 29863 benchmarks/packed_varlen.py --real-ring --tokens 65536,131072 --doc-lens 16384,65536 --layout zigzag,documents,auto --kernel cudnn,auto --warmup 3 --iters 10 --out $R/packed_ring_4gpu_long_kernels.json > $G/packed_long.log 2>&1; mark packed_long $?
for f in $G/*.log; do echo "## $f"; grep -v "^W1127\|Warning\|return func" $f | tail -n 14; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
