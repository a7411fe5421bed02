# session 31 call 2 (one GPU): a 15-step trace of the preset (gaps, memsets), then issue 16's row on this GPU
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ../whl/*.whl || exit 1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning, cudnn; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 580 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; steps=$2; shift 2; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=$steps "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step $steps/|optimizer:|rror" $R/tt_$name.log | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/summary.json $R/tt_$name.summary.json
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
TRACE_OUT=/tmp/tr.json tt trace 60 'train.callbacks=["trace_cb:Trace"]'; grep -A14 "^TRACE" $R/tt_trace.log | cut -c1-250
python ../kern2.py /tmp/tr.json 15 > $R/kern.txt; python ../gaps31.py /tmp/tr.json 15 > $R/gaps.txt 2>&1; cat $R/gaps.txt | cut -c1-600; gzip -c /tmp/tr.json > $OUT/trace.json.gz; ls -la $OUT; t
tt shipped 300
peer accelerate
peer fabric
tt shipped2 300
cd $OUT && tar czf r.tgz r && rm -rf r
