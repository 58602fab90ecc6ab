#!/usr/bin/env bash
# Tenth session, call 7 (one GPU): the packed thread-ring test with the contiguous layout added
# (every rank's loops on one GPU, bf16 vs fp64), and the contiguous schedule's unit tests.
. docs/benchmarks/device_prelude.sh
timeout $(lt 200) python3 -m pytest -m gpu -q -p no:cacheprovider -rfEX tests/gpu/test_gpu_packed.py -k thread_ring \
    > $G/gpu_thread_ring.log 2>&1; mark gpu_thread_ring $?
tail -5 $G/gpu_thread_ring.log >> $L; save; echo "done t=$(( $(date +%s) - T0 ))" >> $L
