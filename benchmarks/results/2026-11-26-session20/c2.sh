# call 2 (one GPU): the row kernel persistent vs shipped (isolation); inductor's output code of the GPT-2 preset
# (default and mix-order reduction off); A/B/A/B of mix-order off; a kernel trace with it off
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|done|rror|TRACE|idle by" $R/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
echo "== rows2"; timeout 150 python .gpu/rows2.py 2>&1 | tee $R/rows2.txt; t
TORCH_LOGS=output_code tt code python -m turbotrain train gpt2-124m train.steps=40
TORCH_LOGS=output_code TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 tt code_mor0 python -m turbotrain train gpt2-124m train.steps=40
tt a1 python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 tt b1 python -m turbotrain train gpt2-124m train.steps=100
tt a2 python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 tt b2 python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 TRACE_OUT=/tmp/trace_m0.json tt trace_m0 python -m turbotrain train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
python .gpu/kern2.py /tmp/trace_m0.json 15 > $R/kern_mor0.txt; head -12 $R/kern_mor0.txt
cd $OUT && tar czf r.tgz r && rm -rf r
