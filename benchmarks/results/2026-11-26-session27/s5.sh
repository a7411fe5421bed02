# session 27 call 5 (one GPU): the final tree (.gpu/final) after the review fixes — every GPU-marked test, the preset
# once (packed attention on, the attention measurement with the switch in force), a short profile of the preset
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 330 - $(date +%s) + s )); }
echo "== GPU tests"; timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
echo "== tt shipped"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 $C run.name=shipped > $R/tt_shipped.log 2>&1
grep -E "step 100/|compile:|rror|attention" $R/tt_shipped.log | grep -v "compiling the model\|cold start" | tail -4; cp /tmp/g/shipped/metrics.jsonl $R/tt_shipped.jsonl; grep -o "packed_attention = [a-z]*" /tmp/g/shipped/config.toml
python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_shipped.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t
echo "== profile"; timeout $(left) python -m turbotrain profile gpt2-124m run.out_dir="'/tmp/g'" run.name=prof > $R/profile.log 2>&1; echo "rc=$?"; grep -E "verdict|attention|rror|step time|ms" $R/profile.log | head -12; t
cd $OUT && tar czf r.tgz r && rm -rf r
