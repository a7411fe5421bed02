# session 23 call 3 (one GPU): the final tree — the GPT-2 preset once (a regression check, no peer), a checkpointed run
# and its resume, and the GPU tests (FP8 among them: this wave gives a model's FP8 layers back after a run)
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate; print(torch.__version__, triton.__version__, accelerate.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
echo "== tt shipped"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 $C run.name=shipped > $R/tt_shipped.log 2>&1
grep -E "step 100/|compile:|done|rror" $R/tt_shipped.log | tail -3; cp /tmp/g/shipped/metrics.jsonl $R/tt_shipped.jsonl; t
K="train.log_every=10 data.eval_batches=2 checkpoint.every=20 run.out_dir='/tmp/k' run.name=k"
timeout $(left) python -m turbotrain train gpt2-124m train.steps=40 $K > $R/ck1.log 2>&1; echo "rc=$?"; tail -2 $R/ck1.log
timeout $(left) python -m turbotrain train gpt2-124m train.steps=60 $K > $R/ck2.log 2>&1; echo "rc=$?"; grep -E "resumed|done|rror" $R/ck2.log | tail -3; t
echo "== GPU tests"; timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider tests/ -x > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -3 $R/gpu_tests.txt; t
cd $OUT && tar czf r.tgz r && rm -rf r
