#!/usr/bin/env bash
# Call 3 (eighth session): issue 44 - the whole GPU peer matrix after the exit abort (GPUs 0,1;
# graphed scenarios as users run them, step marks in their own scenarios), and the graph-launch
# repro (GPU 3): does a replay launch block behind a running one with external event nodes?
. docs/benchmarks/device_prelude.sh
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target .site .whl/diag/*.whl 2>&1 | tail -2
echo "py-spy: $(which py-spy)" >> $L
( CUDA_VISIBLE_DEVICES=0,1 timeout $(lt 330) python3 benchmarks/diagnostics/peer_death.py --matrix gpu --jobs 6 --budget 240 \
     --out $R/peer_matrix.json > $G/peer_matrix.log 2>&1; mark peer_matrix $? ) &
( CUDA_VISIBLE_DEVICES=3 timeout $(lt 120) python3 benchmarks/diagnostics/replay_launch_block.py --spin 2 --launches 4 \
     --out $R/replay_launch_block.json > $G/replay_launch_block.log 2>&1; mark replay_launch_block $? ) &
wait
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L; save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
