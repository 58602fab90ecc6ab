#!/usr/bin/env bash
# Final call on 4 GPUs: issue 44 matrix + soak, issue 41 ring-4 training/profile/ceiling/inference
# before-after, issue 42 cuDNN segments repro + packed layouts + GPU packed tests.
exec 2>>$OUT/log.txt
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }; lt() { local x=$(left $1); [ $x -lt 5 ] && x=5; echo $x; }
L=$OUT/log.txt; R=/tmp/res; G=/tmp/res/logs; mkdir -p $R $G
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/base/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; export PYTHONPATH=$SITE:$ROOT
nvidia-smi --query-gpu=name --format=csv,noheader >> $L; nvidia-smi topo -m >> $L 2>&1
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())" >> $L
save() { (cd $R && tar czf $OUT/results.tgz --exclude=logs . && tar czf $OUT/logs.tgz logs); }
# --- phase 1: peer faults on GPUs 0,1 beside the soak on GPUs 2,3 ------------------------------
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 160) torchrun --nproc_per_node=2 --master_port 29750 benchmarks/diagnostics/soak.py --out $R/soak.json > $G/soak.log 2>&1; mark soak $? ) &
CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 160) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 6 --budget 105 --out $R/peer_death_gpu.json > $G/peer_death_gpu.log 2>&1; mark peer_matrix $?
python3 benchmarks/diagnostics/peer_death.py --table $R/peer_death_gpu.json > $R/peer_death_gpu_table.md 2>>$L
wait; save
# --- phase 2: one-GPU jobs, one per GPU ------------------------------------------------------------
C="--heads 32 --kv-heads 8,32 --head-dim 128 --passes fwd,fwd+bwd --iters 3 --budget-ms 800 --time-limit 90"
( CUDA_VISIBLE_DEVICES=0 timeout $(lt 290) python3 -m benchmarks ceiling --tokens 16384,32768,131072 --rings 2,4,8 --masks full,causal $C --out $R/ceiling_1xH200.json > $G/ceiling.log 2>&1; mark ceiling $? ) &
( CUDA_VISIBLE_DEVICES=3 timeout $(lt 290) python3 -m benchmarks ceiling --tokens 32768,131072 --rings 2,4,8 --masks packed --docs exp:4096 $C --out $R/ceiling_packed_1xH200.json > $G/ceiling_packed.log 2>&1; mark ceiling_packed $? ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout $(lt 240) python3 benchmarks/diagnostics/cudnn_segments_repro.py --out $R/cudnn_segments_repro.json > $G/cudnn_repro.log 2>&1; mark cudnn_repro $?
  timeout $(lt 290) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gpu_training.py -k held_back > $G/gpu_held_back.log 2>&1; mark gpu_held_back $? ) &
( CUDA_VISIBLE_DEVICES=2 timeout $(lt 290) python3 benchmarks/packed_varlen.py --tokens 32768,131072 --rings 2,4 --layout zigzag,documents,auto --out $R/packed_varlen_layouts.json > $G/packed_varlen.log 2>&1; mark packed_varlen $? ) &
wait; save
# --- phase 3: ring 4 training (hold-back on/off, ulysses), old package, profile ------------------
S="--warmup 3 --iters 10"
timeout $(lt 385) torchrun --nproc_per_node=4 --master_port 29751 benchmarks/multi_node_train.py --methods token_ring,token_ring_hold_back,ulysses --seqs 16384,32768 $S --check --out $R/mnt4_new.json > $G/mnt4_new.log 2>&1; mark mnt4_new $?
PYTHONPATH=$SITE:$ROOT/.old timeout $(lt 415) torchrun --nproc_per_node=4 --master_port 29752 benchmarks/multi_node_train.py --methods token_ring,ulysses --seqs 16384 $S --out $R/mnt4_old.json > $G/mnt4_old.log 2>&1; mark mnt4_old $?
timeout $(lt 455) torchrun --nproc_per_node=4 --master_port 29753 benchmarks/profile_train_call.py --seqs 16384 --hold-back 0 1 --out $R/profile_train_ring4.json > $G/prof_train4.log 2>&1; mark prof_train4 $?
save
# --- phase 4: inference at ring 4 must not get slower (old/new ring_sweep) ---------------------
( cd .old && PYTHONPATH=$SITE:$ROOT/.old timeout $(lt 487) torchrun --nproc_per_node=4 --master_port 29754 benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep4_old.json ) > $G/sweep4_old.log 2>&1; mark sweep4_old $?
timeout $(lt 520) torchrun --nproc_per_node=4 --master_port 29755 benchmarks/ring_sweep.py --max-tokens 16896 --iters 20 --out $R/sweep4_new.json > $G/sweep4_new.log 2>&1; mark sweep4_new $?
save
# --- phase 5: packed documents on GPUs (both layouts, thread ring + real NCCL ring of 4) --------
timeout $(lt 575) python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_gpu_packed.py > $G/gpu_packed.log 2>&1; mark gpu_packed $?
for f in $G/*.log; do echo "## $f"; tail -n 5 $f; done >> $L
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
