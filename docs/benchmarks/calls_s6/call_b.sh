#!/usr/bin/env bash
# Call B: FA4 part 1 staged; issue 45: two "nodes" x 2 GPUs stand-in (links, forward u2 x r2, training u2 x r2)
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/resb; G=$R/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
mkdir -p .site/.fa4parts && cp .whl/fa4b/cu13.part1 .site/.fa4parts/; ls -la .site/.fa4parts >> $L
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
for s in wide default; do
  if [ $s = wide ]; then S="--socket-threads 4 --socks-per-thread 4"; else S=""; fi
  M="python3 -m benchmarks multi_node --nodes 2 --gpus-per-node 2 $S"
  if [ $s = wide ]; then B=0; else B=280; fi
  timeout $(lt $((B+40))) $M --nccl-log $R/links_2x2_$s.txt --stamp $R/nccl_peers_2x2_$s.json benchmarks/diagnostics/nccl_peers.py --out $R/nccl_peers_2x2_$s.json > $G/peers_$s.log 2>&1; mark peers_$s $?
  timeout $(lt $((B+130))) $M --stamp $R/sweep_2x2_u2_$s.json ring_sweep --ulysses 2 --out $R/sweep_2x2_u2_$s.json --iters 5 --warmup 2 > $G/sweep_$s.log 2>&1; mark sweep_$s $?
  timeout $(lt $((B+270))) $M --stamp $R/train_2x2_u2_$s.json train_sweep --ulysses 2 --check --seqs 16384,65536,131072 --iters 3 --warmup 1 --no-one-gpu --out $R/train_2x2_u2_$s.json > $G/train_$s.log 2>&1; mark train_$s $?
  save
done
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
