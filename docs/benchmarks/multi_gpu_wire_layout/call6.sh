#!/usr/bin/env bash
# Issue 34, session 2026-11-26 (c), call 6: a failed capture leaves torch.randn working and names
# the op that broke it; the watchdog tests with the thread-local capture mode.
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/.site:$PWD PATH=$PWD/.site/bin:$PATH PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_gpu_watchdog.py tests/gpu/test_gpu_graph_cache.py > /tmp/a.log 2>&1; echo "rc=$?" >> $OUT/log.txt
grep -E "PASSED|FAILED|passed|failed|Error" /tmp/a.log | cut -c1-400 >> $OUT/log.txt
