#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 3: the K/V passthrough + 16-row merge. PixArt 2048 on
# both GPU pairs (run-to-run spread), Flux 2048, merge timing, xDiT/token-ring GPU tests,
# PixArt profile.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $G/lanes.txt; }
( export CUDA_VISIBLE_DEVICES=0,1
  timeout 150 torchrun --nproc_per_node=2 --master_port 29901 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048_a.json > $G/a1.log 2>&1; mark e2e_pixart_a $?
  timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_xdit.py > $G/a2.log 2>&1; mark gpu_xdit $?
  timeout $(left 420) torchrun --nproc_per_node=2 --master_port 29902 benchmarks/e2e_pipeline.py --model flux --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_flux2048.json > $G/a3.log 2>&1; mark e2e_flux $?
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 150 torchrun --nproc_per_node=2 --master_port 29911 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048_b.json > $G/b1.log 2>&1; mark e2e_pixart_b $?
  timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_token_ring.py tests/gpu/test_gpu_graph_cache.py > $G/b2.log 2>&1; mark gpu_token_ring $?
  CUDA_VISIBLE_DEVICES=2 timeout 100 python3 benchmarks/diagnostics/merge_bandwidth.py --old old_fused_merge.py --out $OUT/merge_bandwidth.json > $G/b3.log 2>&1; mark merge_bw $?
  timeout $(left 420) torchrun --nproc_per_node=2 --master_port 29912 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --no-one-gpu --no-graph-transformer --profile $OUT/prof --profile-steps 5 --out $OUT/e2e_pixart2048_profile.json > $G/b4.log 2>&1; mark e2e_profile $?
) &
wait
cat $G/lanes.txt >> $L
for f in a2 b2; do tail -n 4 $G/$f.log >> $L; done
python3 - >> $L <<'PY'
import json, os
O = os.environ["OUT"]
for f in ("e2e_pixart2048_a.json", "e2e_pixart2048_b.json", "e2e_flux2048.json", "e2e_pixart2048_profile.json"):
    try:
        r = json.load(open(f"{O}/{f}"))["rows"][0]
        print(f, {k: round(v, 3) for k, v in r.items() if k.endswith("_s")})
    except Exception as e: print(f, "missing", e)
try:
    for r in json.load(open(f"{O}/merge_bandwidth.json"))["rows"]:
        print(r["shape"], r["storage"], "new", r["triton_us"], "old", r.get("triton_old_us"), "copy", r["copy_us"])
except Exception as e: print("merge missing", e)
PY
for f in $OUT/prof/*token_ring*.txt; do head -c 400 $f >> $L; echo >> $L; grep -E "aten::(copy_|cat|add|mul) |merge2|cudnn_generated|CatArray|Memcpy DtoD|spin_kernel|SendRecv" $f | awk '{n=NF; print $1, $(n-3), $(n-2), $(n)}' >> $L; done
cd $G && tar czf $OUT/logs.tgz *.log
echo "done t=$(( $(date +%s) - T0 ))" >> $L
