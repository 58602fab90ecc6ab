#!/usr/bin/env bash
# Call C: FA4 assembled + fa4_vs_cudnn (GPU 0) || soak with expandable segments (GPUs 2,3); then issue 45: four one-GPU nodes
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/resc; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD
( export CUDA_VISIBLE_DEVICES=2,3 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout $(lt 110) torchrun --nproc_per_node=2 --master_port 29780 benchmarks/diagnostics/soak.py --out $R/soak_expandable.json > $G/soak_exp.log 2>&1; mark soak_exp $? ) &
( export CUDA_VISIBLE_DEVICES=0
  W=/tmp/nvidia_cutlass_dsl_libs_cu13-4.6.2-cp312-cp312-manylinux_2_28_x86_64.whl
  cat .site/.fa4parts/cu13.part0 .site/.fa4parts/cu13.part1 .whl/fa4c/cu13.part2 > $W && echo "a299a623fad75eb752c1a4e447b924e9049ed396b037509c41a48da82d1f340a  $W" | sha256sum -c >> $L 2>&1 || { echo "parts missing" >> $L; exit 3; }
  mkdir -p /tmp/fa4site && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa4site $W .whl/fa4c/*.whl 2>&1 | tail -3 >> $L
  export PYTHONPATH=/tmp/fa4site:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
  mark fa4_installed 0
  timeout $(lt 200) python3 benchmarks/diagnostics/fa4_vs_cudnn.py --tokens 16384,32768 --rings 2,4 --budget-s 75 --out $R/fa4_vs_cudnn.json > $G/fa4.log 2>&1; mark fa4 $? ) &
wait; save
M="python3 -m benchmarks multi_node --nodes 4 --gpus-per-node 1 --socket-threads 4 --socks-per-thread 4"
timeout $(lt 230) $M --nccl-log $R/links_4x1_wide.txt --stamp $R/nccl_peers_4x1_wide.json benchmarks/diagnostics/nccl_peers.py --out $R/nccl_peers_4x1_wide.json > $G/peers_4x1.log 2>&1; mark peers_4x1 $?
save
timeout $(lt 300) $M --stamp $R/sweep_4x1_wide.json ring_sweep --out $R/sweep_4x1_wide.json --iters 5 --warmup 2 > $G/sweep_4x1.log 2>&1; mark sweep_4x1 $?
save
timeout $(lt 470) $M --stamp $R/train_4x1_wide.json multi_node_train --shapes mha-32:32:32:128:full,mha-32c:32:32:128:causal --methods token_ring,yunchang_basic,yunchang_zigzag,ulysses --seqs 16384,65536 --check --iters 3 --warmup 1 --out $R/train_4x1_wide.json > $G/train_4x1.log 2>&1; mark train_4x1 $?
for f in $G/*.log; do echo "## $f"; tail -n 8 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
