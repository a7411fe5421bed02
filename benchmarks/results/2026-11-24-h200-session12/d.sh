# call D: llama-1b on one H200, issue 16's acceptance 3 in one call: turbotrain FP8 tensorwise + head in FP8 (fused
# loss off), Accelerate FP8 (AORecipeKwargs), Accelerate bf16 + dynamo, then turbotrain tensorwise as shipped
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, torchao, accelerate; print(torch.__version__, torchao.__version__, accelerate.__version__)" >> $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l'"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
echo "== tt tensorwise + fp8_head, fused loss off" >> $OUT/summary.txt
timeout 170 python -m turbotrain train llama-1b $L 'precision.fp8="tensorwise"' precision.fp8_head=true kernels.fused_loss=false run.name=head > $OUT/tt_head.log 2>&1
grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_head.log >> $OUT/summary.txt; t
for m in fp8 bf16; do
  echo "== accelerate $m" >> $OUT/summary.txt
  timeout 190 python benchmarks/baselines/peer.py --framework accelerate --workload llama $([ $m = fp8 ] && echo --fp8) --steps 30 --warmup-steps 5 --windows 3 > $OUT/acc_$m.log 2>&1
  tail -1 $OUT/acc_$m.log >> $OUT/summary.txt; t
done
echo "== tt tensorwise (shipped: head in bf16, fused loss on)" >> $OUT/summary.txt
timeout $(( 585 - $(date +%s) + s )) python -m turbotrain train llama-1b $L 'precision.fp8="tensorwise"' run.name=tw > $OUT/tt_tw.log 2>&1
grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_tw.log >> $OUT/summary.txt; t
