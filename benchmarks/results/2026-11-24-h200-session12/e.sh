# call E: llama-1b on one H200: turbotrain tensorwise + fp8_head with (a) fast accumulation in the backward GEMMs,
# (b) every linear converted (Accelerate's choice), Accelerate FP8 in the same call, then (a)+(b)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\" precision.fp8_head=true kernels.fused_loss=false"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
tt() { # variant seconds
  echo "== tt head + $1" >> $OUT/summary.txt
  FP8V=$1 timeout $2 python .gpu/fp8v.py train llama-1b $L run.name=$1 > $OUT/tt_$1.log 2>&1
  grep -E "fp8|step [234]0|compile:|done|rror" $OUT/tt_$1.log >> $OUT/summary.txt; t
}
tt fastbw 160
tt all 160
echo "== accelerate fp8" >> $OUT/summary.txt
timeout 170 python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3 > $OUT/acc_fp8.log 2>&1
tail -1 $OUT/acc_fp8.log >> $OUT/summary.txt; t
tt fastbw+all $(( 588 - $(date +%s) + s ))
