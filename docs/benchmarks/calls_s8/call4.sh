#!/usr/bin/env bash
# Call 4 (eighth session): issue 44 - the whole GPU peer matrix after the watchdog's event fix
# (GPUs 0,1), then the marked replays once more (GPUs 2,3) for a second sample.
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
MK=infer_graphed-die-plain-cuda-marks,infer_graphed-hang-plain-cuda-marks,ipc-die-plain-cuda-marks,ipc-hang-plain-cuda-marks
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 330) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 6 --budget 240 \
     --out $R/peer_matrix.json > $G/peer_matrix.log 2>&1; mark peer_matrix $? ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout $(lt 200) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --only $MK --jobs 4 \
     --out $R/peer_marks.json > $G/peer_marks.log 2>&1; mark peer_marks $? ) &
wait
for f in $G/*.log; do echo "## $f"; tail -n 4 $f; done >> $L; save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
