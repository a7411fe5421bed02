# call O: gpt2-124m preset (reduce-overhead) vs compile.mode="max-autotune" (Triton GEMM autotuning + CUDA graphs),
# same call, one H200; 100 steps each, throughput = median of the 10-step log windows after step 30
export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
G="train.steps=100 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
left() { echo $(( 575 - $(date +%s) + s )); }
for v in preset mat; do
  echo "== gpt2-124m $v" >> $OUT/summary.txt
  timeout $(left) python -m turbotrain train gpt2-124m $G run.name=$v $([ $v = mat ] && echo 'compile.mode="max-autotune"') > $OUT/tt_$v.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $OUT/tt_$v.log | grep -v "compiling the model" >> $OUT/summary.txt; t
done
