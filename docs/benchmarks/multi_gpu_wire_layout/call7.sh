#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 7 (final code, 4 GPUs): the ulysses 2 x ring 2 sweeps owed
# since the head start (inference and training) and the ring-4 inference sweep with the new merge.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
timeout 90 torchrun --nproc_per_node=4 --master_port 29921 benchmarks/ring_sweep.py --ulysses 2 --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_u2r2.json > $G/a.log 2>&1; mark sweep_u2r2 $?
timeout 120 torchrun --nproc_per_node=4 --master_port 29922 benchmarks/train_sweep.py --ulysses 2 --check --seqs 16384,32768 --iters 5 --warmup 2 --out $OUT/train_u2r2.json > $G/b.log 2>&1; mark train_u2r2 $?
timeout $(left 330) torchrun --nproc_per_node=4 --master_port 29923 benchmarks/ring_sweep.py --max-tokens 32768 --iters 10 --warmup 3 --out $OUT/sweep_r4.json > $G/c.log 2>&1; mark sweep_r4 $?
python3 - >> $L <<'PY'
import json, os
O = os.environ["OUT"]
for f in ("sweep_u2r2.json", "sweep_r4.json"):
    try:
        for r in json.load(open(f"{O}/{f}"))["rows"]:
            print(f, r["model"], r["tokens"], {k: round(r[k], 3) for k in r if k.endswith("_ms")})
    except Exception as e: print(f, "missing", e)
try:
    d = json.load(open(f"{O}/train_u2r2.json"))
    for r in d["rows"]: print("train", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
except Exception as e: print("train missing", e)
PY
cd $G && tar czf $OUT/logs.tgz *.log
