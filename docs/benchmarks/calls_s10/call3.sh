#!/usr/bin/env bash
# Issue 44: the whole GPU peer matrix twice at once (GPUs 0,1 and 2,3; six scenarios at a time
# each, as the test runs it), native stacks of any rank still running at its wall (py-spy), to
# see call 1's ipc-hang-plain-cuda-marks failure again (rank 0 blocked in its first cuDNN call).
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
for pair in 0,1 2,3; do
  ( CUDA_VISIBLE_DEVICES=$pair timeout $(lt 400) python3 benchmarks/diagnostics/peer_death.py --matrix gpu \
      --jobs 6 --out $R/matrix_${pair/,/}.json > $G/matrix_${pair/,/}.log 2>&1; mark matrix_$pair $? ) &
done
wait
for f in $R/matrix_*.json; do
  python3 - $f >> $L <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
bad = [s for s in d["scenarios"] if s.get("problems")]
print(sys.argv[1], len(d["scenarios"]), "scenarios,", len(bad), "with problems")
for s in bad:
    print(" ", s["name"], s["problems"], s.get("timeline"))
    for k, v in (s.get("native_stacks") or {}).items():
        print("  native", k, v[-6000:])
PY
done
save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
