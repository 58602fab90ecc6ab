#!/usr/bin/env bash
# Issue 40, session 2026-11-26 (d): ring 2 before/after the one-seam restructure, same machine,
# alternating. Old = tokenring_xdit + benchmarks at 699405d in .old/. Then issue 44: where a
# survivor's eager training loop stands while the ring's abort hangs (py-spy, native frames).
exec 2>>$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>&1 | tail -2
export PATH=$PWD/.site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE=$PWD/.site; ROOT=$PWD; L=$OUT/log.txt; G=/tmp/logs; mkdir -p $G /tmp/res
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
mark() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))" >> $L; }
nvidia-smi --query-gpu=name --format=csv,noheader >> $L
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.nccl.version())" >> $L
run() { # code(old|new) tag port cmd...
  local code=$1 tag=$2 port=$3; shift 3
  local dir=$ROOT; [ $code = old ] && dir=$ROOT/.old
  ( cd $dir && PYTHONPATH=$SITE:$dir timeout $(left 500) torchrun --nproc_per_node=2 --master_port $port "$@" ) > $G/$tag.log 2>&1; mark $tag $?
}
for i in 1 2; do
  run old sweep_old$i 2960$i benchmarks/ring_sweep.py --out /tmp/res/sweep_old$i.json
  run new sweep_new$i 2961$i benchmarks/ring_sweep.py --out /tmp/res/sweep_new$i.json
done
run old train_old1 29621 benchmarks/train_sweep.py --check --seqs 16384,32768 --iters 5 --warmup 2 --out /tmp/res/train_old1.json
run new train_new1 29631 benchmarks/train_sweep.py --check --seqs 16384,32768 --iters 5 --warmup 2 --out /tmp/res/train_new1.json
( sleep 24; for p in $(pgrep -f "MODE, DIE_AT"); do echo "--- pid $p"; py-spy dump --native --pid $p 2>&1 | head -80; done > $G/peer_death_spy.txt ) &
PYTHONPATH=$SITE:$ROOT timeout 60 python3 benchmarks/diagnostics/peer_death.py --mode train --graphs 0 --wall 45 --out /tmp/res/peer_death_train_spy.json > $G/peer_death.log 2>&1; mark peer_death $?
wait
for f in $G/*.log; do echo "## $f"; tail -n 6 $f; done >> $L
(cd /tmp/res && tar czf $OUT/results.tgz *.json); (cd /tmp && tar czf $OUT/logs.tgz logs)
echo "done t=$(( $(date +%s) - T0 ))" >> $L
