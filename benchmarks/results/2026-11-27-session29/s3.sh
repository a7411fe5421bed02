# session 29 call 3 (one GPU): TritonAdamW at BLOCK 1024 / 4 warps (tree 9fa3ad9): check + micro, then issue 16's row with and without it
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
python -c "import torch, triton, accelerate, lightning; print(torch.__version__, torch.version.cuda, triton.__version__, accelerate.__version__, lightning.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|optimizer:|rror" $R/tt_$name.log | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
echo "== micro"; timeout 100 python ../exp29.py 2>&1 | tee $R/micro.log | grep -E "micro|rror" ; t
tt triton 'train.optimizer_impl="triton"'
tt base
peer accelerate
tt triton2 'train.optimizer_impl="triton"'
tt base2
peer fabric
cd $OUT && tar czf r.tgz r && rm -rf r
