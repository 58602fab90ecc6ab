#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 1: the 16-byte Triton merge and the wire layout.
# Merge bandwidth (new vs old kernel); PixArt/Flux 2048 end to end; ring-2 sweep; GPU tests.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G $OUT/more
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $G/lanes.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -4 >> $L
( export CUDA_VISIBLE_DEVICES=0,1
  CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/diagnostics/merge_bandwidth.py --old old_fused_merge.py --out $OUT/merge_bandwidth.json > $G/a1.log 2>&1; mark merge_bw $?
  timeout 150 torchrun --nproc_per_node=2 --master_port 29901 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_pixart2048.json > $G/a2.log 2>&1; mark e2e_pixart $?
  timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_token_ring.py tests/gpu/test_gpu_graph_cache.py > $G/a3.log 2>&1; mark gpu_token_ring $?
  timeout $(left 400) torchrun --nproc_per_node=2 --master_port 29902 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --no-one-gpu --no-graph-transformer --profile $OUT/more/prof --profile-steps 5 --out $OUT/more/e2e_pixart2048_profile.json > $G/a4.log 2>&1; mark e2e_profile $?
) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 90 torchrun --nproc_per_node=2 --master_port 29911 benchmarks/ring_sweep.py --out $OUT/sweep_r2.json > $G/b1.log 2>&1; mark sweep_r2 $?
  timeout 120 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_xdit.py > $G/b2.log 2>&1; mark gpu_xdit $?
  timeout $(left 420) torchrun --nproc_per_node=2 --master_port 29912 benchmarks/e2e_pipeline.py --model flux --sizes 2048 --steps 20 --repeats 1 --out $OUT/e2e_flux2048.json > $G/b3.log 2>&1; mark e2e_flux $?
) &
wait
cat $G/lanes.txt >> $L
for f in a3 b2; do tail -n 4 $G/$f.log >> $L; done
python3 - >> $L <<'PY'
import json, os
O = os.environ["OUT"]
for f in ("e2e_pixart2048.json", "e2e_flux2048.json"):
    try:
        r = json.load(open(f"{O}/{f}"))["rows"][0]
        print(f, {k: round(v, 3) for k, v in r.items() if k.endswith("_s")})
    except Exception as e: print(f, "missing", e)
try:
    for r in json.load(open(f"{O}/sweep_r2.json"))["rows"]:
        print("sweep", r.get("model"), r.get("tokens"), {k: r[k] for k in ("token_ring_ms", "token_ring_efficiency", "token_ring_whole_own_ms", "ulysses_ms", "single_ms")})
except Exception as e: print("sweep missing", e)
PY
tail -c 3000 $G/a4.log >> $L
cd $G && tar czf $OUT/more/logs.tgz *.log
echo "done t=$(( $(date +%s) - T0 ))" >> $L
