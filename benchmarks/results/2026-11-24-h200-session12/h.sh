# call H: llama-1b on one H200, acceptance 3's FP8 ratio with repeats in one call: turbotrain tensorwise + fp8_head
# (fused loss off) and Accelerate FP8 alternated twice, then Accelerate bf16 + dynamo while time is left
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, torchao, accelerate; print(torch.__version__, torchao.__version__, accelerate.__version__)" >> $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\" precision.fp8_head=true kernels.fused_loss=false"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
left() { echo $(( 575 - $(date +%s) + s )); }
for i in 1 2; do
  echo "== tt tensorwise + fp8_head, fused loss off ($i)" >> $OUT/summary.txt
  timeout $(left) python -m turbotrain train llama-1b $L run.name=head$i > $OUT/tt_head$i.log 2>&1
  grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_head$i.log >> $OUT/summary.txt; t
  echo "== accelerate fp8 ($i)" >> $OUT/summary.txt
  timeout $(left) python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3 > $OUT/acc_fp8_$i.log 2>&1
  tail -1 $OUT/acc_fp8_$i.log >> $OUT/summary.txt; t
done
echo "== accelerate bf16" >> $OUT/summary.txt
timeout $(left) python benchmarks/baselines/peer.py --framework accelerate --workload llama --steps 30 --warmup-steps 5 --windows 3 > $OUT/acc_bf16.log 2>&1
tail -1 $OUT/acc_bf16.log >> $OUT/summary.txt; t
