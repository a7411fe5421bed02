# call N: llama-1b, same call: turbotrain tensorwise + fp8_head (fused loss off) with compile.coordinate_descent_tuning
# and without, and Accelerate FP8 (optimizer after prepare)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\" precision.fp8_head=true kernels.fused_loss=false"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
left() { echo $(( 575 - $(date +%s) + s )); }
for v in cdt plain; do
  echo "== tt tensorwise + fp8_head, fused loss off, $v" >> $OUT/summary.txt
  timeout $(left) python -m turbotrain train llama-1b $L run.name=$v $([ $v = cdt ] && echo compile.coordinate_descent_tuning=true) > $OUT/tt_$v.log 2>&1
  grep -E "step [234]0|compile:|done|rror" $OUT/tt_$v.log | grep -v "compiling the model" >> $OUT/summary.txt; t
done
echo "== accelerate fp8 (optimizer after prepare)" >> $OUT/summary.txt
timeout $(left) python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3 > $OUT/acc_fp8.log 2>&1
tail -1 $OUT/acc_fp8.log >> $OUT/summary.txt; t
