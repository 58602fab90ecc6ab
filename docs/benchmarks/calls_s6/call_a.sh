#!/usr/bin/env bash
# Call A (4 x H200): issue 44 GPU matrix + soak; issue 42 packed real rings 2/4 + one-GPU layouts;
# issue 41 alternated ring-4 before/after (training and inference); FA4 part A staged.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=/tmp/res/logs; rm -rf $R; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
mkdir -p .site/.fa4parts && cp .whl/fa4a/cu13.part0 .site/.fa4parts/
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; export PYTHONPATH=$SITE:$ROOT
nvidia-smi --query-gpu=name --format=csv,noheader >> $L; nvidia-smi topo -m >> $L 2>&1
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())" >> $L
git log --oneline -1 >> $L 2>&1
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
# --- phase 1: peer-fault matrix on GPUs 0,1 || soak, packed ring 2 and one-GPU packed on GPUs 2,3 ----
( export CUDA_VISIBLE_DEVICES=2,3
  timeout $(lt 100) torchrun --nproc_per_node=2 --master_port 29750 benchmarks/diagnostics/soak.py --out $R/soak.json > $G/soak.log 2>&1; mark soak $?
  timeout $(lt 190) torchrun --nproc_per_node=2 --master_port 29756 benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 --layout zigzag,documents,auto --check --warmup 3 --iters 10 --out $R/packed_ring_2gpu.json > $G/packed_ring2.log 2>&1; mark packed_ring2 $?
  ( CUDA_VISIBLE_DEVICES=2 timeout $(lt 270) python3 benchmarks/packed_varlen.py --tokens 32768,131072 --rings 2,4 --layout zigzag,documents,auto --out $R/packed_varlen_layouts.json > $G/packed_varlen.log 2>&1; mark packed_varlen $? ) &
  wait ) &
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 275) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 7 --budget 190 --out $R/peer_death_gpu.json > $G/peer_death_gpu.log 2>&1; mark peer_matrix $?
python3 benchmarks/diagnostics/peer_death.py --table $R/peer_death_gpu.json > $R/peer_death_gpu_table.md 2>>$L
wait; save
# --- phase 2: ring 4, before/after alternated (old = .old, afc6f22) -----------------------------
S="--methods token_ring,ulysses --seqs 16384 --warmup 3 --iters 10"
i=0
for who in new old new old; do i=$((i+1))
  if [ $who = old ]; then PP=$SITE:$ROOT/.old; else PP=$SITE:$ROOT; fi
  PYTHONPATH=$PP timeout $(lt $((285+i*30))) torchrun --nproc_per_node=4 --master_port $((29760+i)) benchmarks/multi_node_train.py $S --out $R/mnt4_${who}_$i.json > $G/mnt4_${who}_$i.log 2>&1; mark mnt4_${who}_$i $?
done; save
( cd .old && PYTHONPATH=$SITE:$ROOT/.old timeout $(lt 440) torchrun --nproc_per_node=4 --master_port 29770 benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep4_old.json ) > $G/sweep4_old.log 2>&1; mark sweep4_old $?
timeout $(lt 470) torchrun --nproc_per_node=4 --master_port 29771 benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep4_new.json > $G/sweep4_new.log 2>&1; mark sweep4_new $?
save
# --- phase 3: packed real ring 4 ----------------------------------------------------------------
timeout $(lt 565) torchrun --nproc_per_node=4 --master_port 29772 benchmarks/packed_varlen.py --real-ring --tokens 32768,131072 --layout zigzag,documents,auto --check --warmup 3 --iters 10 --out $R/packed_ring_4gpu.json > $G/packed_ring4.log 2>&1; mark packed_ring4 $?
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
