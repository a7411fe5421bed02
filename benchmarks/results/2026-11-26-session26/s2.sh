# session 26 call B (one GPU): the final tree (.gpu/final) — every GPU-marked test, then a preset run with eval,
# a checkpoint and final/ at log_every=1 (a smoke run, no peer)
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
echo "== GPU tests"; timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head; t
C="data.eval_batches=2 checkpoint.every=50 checkpoint.final=true run.out_dir='/tmp/g'"
echo "== tt log1"; timeout 200 python -m turbotrain train gpt2-124m train.steps=100 train.log_every=1 $C run.name=log1 > $R/tt_log1.log 2>&1; echo "rc=$?"
grep -E "step 100/|done|rror" $R/tt_log1.log | tail -2; cp /tmp/g/log1/metrics.jsonl $R/tt_log1.jsonl; cp /tmp/g/log1/summary.json $R/tt_log1.summary.json
python -c "import json; s=json.load(open('$R/tt_log1.summary.json')); print('   timed', round(s['samples_per_s']*1024), 'overall', round(s['samples_per_s_overall']*1024), 'skipped', s.get('skipped_steps'))"; t
cd $OUT && tar czf r.tgz r && rm -rf r
