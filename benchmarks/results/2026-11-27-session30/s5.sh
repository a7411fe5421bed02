# session 30 call 5 (one GPU): the final tree: the preset once (weight copies on), then every GPU-marked test
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 235 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
echo "== tt copies"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=120 $C run.name=copies > $R/tt_copies.log 2>&1; grep -E "step 120/|optimizer:|rror|warning" $R/tt_copies.log | tail -4; cp /tmp/g/copies/metrics.jsonl $R/tt_copies.jsonl; grep -oE "(optimizer_impl|weight_copies) = [a-z\"]*" /tmp/g/copies/config.toml | tr '\n' ' '; echo
python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_copies.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; t
echo "== GPU tests"; timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head; t
cd $OUT && tar czf r.tgz r && rm -rf r
