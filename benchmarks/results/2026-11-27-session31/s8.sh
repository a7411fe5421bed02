# session 31 call 8 (one GPU): the final tree: every GPU-marked test, then issue 16's GPT-2 row again: the preset
# three times, Accelerate twice, Fabric once, interleaved
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning, cudnn; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 590 - $(date +%s) + s )); }
echo "== GPU tests"; timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
med() { python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$1')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; }
tt() { name=$1; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=240 $C run.name=$name compile.cache_dir=/tmp/cc_tt > $R/tt_$name.log 2>&1
  grep -E "step 240/|rror" $R/tt_$name.log | tail -2; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; med $R/tt_$name.jsonl; t; }
peer() { echo "== $1 $2"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1$2.log 2>&1; tail -1 $R/$1$2.log | cut -c1-200; t; }
tt a
peer accelerate 1
tt b
peer fabric
tt c
peer accelerate 2
cd $OUT && tar czf r.tgz r && rm -rf r
