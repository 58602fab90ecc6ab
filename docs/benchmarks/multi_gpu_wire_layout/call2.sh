#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 2: merge GPU time (graph-replayed, tuning grid, old vs
# new kernel); PixArt 2048 profile (5 steps, no transformer graph) with the wire layout.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G $OUT/more
T0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/diagnostics/merge_bandwidth.py --old old_fused_merge.py --out $OUT/merge_bandwidth.json > $G/a1.log 2>&1; echo "merge_bw rc=$? t=$(( $(date +%s) - T0 ))" >> $L ) &
( export CUDA_VISIBLE_DEVICES=2,3
  timeout 240 torchrun --nproc_per_node=2 --master_port 29902 benchmarks/e2e_pipeline.py --model pixart --sizes 2048 --steps 20 --repeats 1 --no-one-gpu --no-graph-transformer --profile $OUT/prof --profile-steps 5 --out $OUT/e2e_pixart2048_profile.json > $G/b1.log 2>&1; echo "profile rc=$? t=$(( $(date +%s) - T0 ))" >> $L ) &
wait
python3 - >> $L <<'PY'
import json, os
O = os.environ["OUT"]
for r in json.load(open(f"{O}/merge_bandwidth.json"))["rows"]:
    tun = {k: v for k, v in r.items() if k.startswith("triton_s")}
    best = min(tun, key=tun.get)
    print(r["shape"], r["storage"], r["mbytes"], "new", r["triton_us"], "old", r.get("triton_old_us"), "torch", r["torch_ops_us"], "copy", r["copy_us"], "best", best, tun[best])
PY
tail -c 1500 $G/b1.log >> $L
for f in $OUT/prof/*.txt; do head -c 400 $f >> $L; echo >> $L; grep -E "merge2|cudnn_generated|CatArray|elementwise_kernel|Memcpy|spin_kernel|SendRecv" $f | cut -c1-60,150-260 >> $L; done
cd $G && tar czf $OUT/more_logs.tgz *.log
