#!/usr/bin/env bash
# Issue 34, session 2026-11-26, call 1 on the 4-GPU kind: owed verification runs.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt
sec() { echo "=== $(date +%T) $*" >> $L; }
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv >> $L; nvidia-smi topo -m >> $L 2>&1
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version())" >> $L
sec smoke, one launch per GPU pair
SCRIPTS_LOG_DIR=/tmp/slog SCRIPTS_TIMEOUT_S=100 timeout 235 python3 -m pytest -m gpu tests/gpu/test_gpu_scripts.py -q -rA -p no:cacheprovider > /tmp/smoke.log 2>&1
tail -n 30 /tmp/smoke.log >> $L; cp /tmp/slog/summary.txt $OUT/smoke_summary.txt
sec exit tests on 0,1 + GPU suite rest on 2,3
(CUDA_VISIBLE_DEVICES=0,1 EXIT_LAUNCHES=2 timeout 170 python3 -m pytest -m gpu tests/gpu/test_gpu_exit.py -q -rA -p no:cacheprovider > /tmp/exit.log 2>&1; echo "exit rc=$?" >> /tmp/exit.log) &
(CUDA_VISIBLE_DEVICES=2,3 timeout 175 python3 -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider --durations=15 \
   --ignore=tests/gpu/test_gpu_scripts.py --ignore=tests/gpu/test_gpu_exit.py --ignore=tests/gpu/test_gpu_compile.py --ignore=tests/gpu/test_gpu_packed.py > /tmp/suite.log 2>&1; echo "suite rc=$?" >> /tmp/suite.log) &
wait
tail -n 12 /tmp/exit.log >> $L; cp /tmp/suite.log $OUT/gpu_suite.txt; tail -n 5 /tmp/suite.log >> $L
sec compile on 0, packed on 1, training ring 2 on 2,3 then ring 1 on 2
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu tests/gpu/test_gpu_compile.py -q -s -rA -p no:cacheprovider > /tmp/compile.log 2>&1; echo "compile rc=$?" >> /tmp/compile.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -m gpu tests/gpu/test_gpu_packed.py -q -rA -p no:cacheprovider > /tmp/packed.log 2>&1; echo "packed rc=$?" >> /tmp/packed.log) &
(CUDA_VISIBLE_DEVICES=2,3 timeout 75 torchrun --nproc_per_node=2 --master_port 29622 benchmarks/train_sweep.py --check --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train2.json > /tmp/t2.log 2>&1; echo "train2 rc=$?" >> /tmp/t2.log
 CUDA_VISIBLE_DEVICES=2 timeout 70 torchrun --nproc_per_node=1 --master_port 29623 benchmarks/train_sweep.py --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train1.json > /tmp/t1.log 2>&1; echo "train1 rc=$?" >> /tmp/t1.log) &
wait
cat /tmp/compile.log /tmp/packed.log /tmp/t2.log /tmp/t1.log > $OUT/tests_and_training.txt
grep -E "rc=|passed|failed" /tmp/compile.log /tmp/packed.log /tmp/t2.log /tmp/t1.log | tail -n 12 >> $L
sec training ring 4, with whatever time is left
LEFT=$(( 555 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && timeout $LEFT torchrun --nproc_per_node=4 --master_port 29624 benchmarks/train_sweep.py --check --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train4.json > /tmp/t4.log 2>&1; echo "train4 rc=$?" >> $L; tail -n 40 /tmp/t4.log >> $L
cd /tmp && tar czf $OUT/slog.tgz slog smoke.log exit.log 2>/dev/null
sec done $(( $(date +%s) - T0 )) s
