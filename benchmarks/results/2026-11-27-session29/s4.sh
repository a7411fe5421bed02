# session 29 call 4 (one GPU): kernel traces of the preset with torch's fused AdamW and with TritonAdamW (tree 9fa3ad9), then 400-step runs A B A B
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; steps=$2; shift 2; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=$steps "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step $steps/|optimizer:|rror|TRACE|idle by" $R/tt_$name.log | tail -4; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; t; }
TRACE_OUT=/tmp/tr_b.json tt trace_base 60 'train.callbacks=["trace_cb:Trace"]'
python ../kern2.py /tmp/tr_b.json 15 > $R/kern_base.txt; head -8 $R/kern_base.txt; grep -iE "adamw|sq_sum|multi_tensor|LpNorm" $R/kern_base.txt | cut -c1-120
TRACE_OUT=/tmp/tr_t.json tt trace_triton 60 'train.optimizer_impl="triton"' 'train.callbacks=["trace_cb:Trace"]'
python ../kern2.py /tmp/tr_t.json 15 > $R/kern_triton.txt; head -8 $R/kern_triton.txt; grep -iE "adamw|sq_sum|multi_tensor|LpNorm" $R/kern_triton.txt | cut -c1-120
tt base 400
tt triton 400 'train.optimizer_impl="triton"'
tt base2 400
tt triton2 400 'train.optimizer_impl="triton"'
cd $OUT && tar czf r.tgz r && rm -rf r
