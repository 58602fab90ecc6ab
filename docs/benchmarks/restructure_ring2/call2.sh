#!/usr/bin/env bash
# Issue 40, session 2026-11-26 (d): the GPU tests after the one-seam restructure (2 GPUs).
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader >> $L
PYT="python3 -m pytest -m gpu -q -rfE -p no:cacheprovider --durations=5"
timeout $(left 400) $PYT tests/gpu --ignore=tests/gpu/test_gpu_scripts.py > $G/gpu.log 2>&1; echo "gpu rc=$? t=$(( $(date +%s) - T0 ))" >> $L
SCRIPTS_LOG_DIR=$G/slog SCRIPTS_TIMEOUT_S=80 timeout $(left 470) $PYT tests/gpu/test_gpu_scripts.py > $G/scripts.log 2>&1; echo "scripts rc=$? t=$(( $(date +%s) - T0 ))" >> $L
for f in gpu scripts; do echo "## $f" >> $L; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $G/$f.log | tail -n 40 >> $L; done
(cd /tmp && tar czf $OUT/logs.tgz logs)
echo "done t=$(( $(date +%s) - T0 ))" >> $L
