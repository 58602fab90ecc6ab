exec 2>>$OUT/log.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd .h7run; export PYTHONPATH=$PWD  # .h7run: a copy of branch h7 at 81048a9
nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/log.txt
D=benchmarks/diagnostics/peer_death.py
timeout 80 python3 $D --mode train --graphs 0 --wall 70 --out $OUT/pd_train.json > /dev/null 2>&1; echo "train rc=$?" >> $OUT/log.txt
timeout 80 python3 $D --mode infer --graphs 1 --wall 70 --out $OUT/pd_graphed.json > /dev/null 2>&1; echo "graphed rc=$?" >> $OUT/log.txt
if ! grep -q '"survivor_exit_code": 3' $OUT/pd_train.json; then
  TORCH_NCCL_USE_COMM_NONBLOCKING=1 timeout 80 python3 $D --mode train --graphs 0 --wall 70 --out $OUT/pd_train_nonblocking.json > /dev/null 2>&1; echo "nb rc=$?" >> $OUT/log.txt
fi
