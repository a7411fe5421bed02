# session 31 call 3 (one GPU): exp31c.py micro (memset nodes -> fill kernels in a captured GEMM chain), then the GPT-2
# preset with the rewrite on / off, A B A B, and the peers in the same call
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning, cudnn; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
echo "== micro"; timeout 90 python ../exp31c.py micro > $R/micro.txt 2>&1; echo "rc=$?"; cut -c1-200 $R/micro.txt | grep -v Warn; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
ab() { on=$1; name=$2; echo "== $name ($on)"; timeout $(left) python ../exp31c.py train $on $name train.steps=300 $C compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 300/|memsets|rror" $R/tt_$name.log | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-200; t; }
ab on fills
ab off plain
peer accelerate
ab on fills2
ab off plain2
peer fabric
cd $OUT && tar czf r.tgz r && rm -rf r
