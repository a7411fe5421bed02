# session 29 call 1 (one GPU): TritonAdamW microbenchmark (exp29.py), then the preset with it, A B A B, and mix-order on
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
python -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|optimizer:|rror" $R/tt_$name.log | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
echo "== micro"; timeout 200 python ../exp29.py 2>&1 | tee $R/micro.log | grep -E "micro|rror" ; t
tt base
tt triton 'train.optimizer_impl="triton"'
tt base2
tt triton2 'train.optimizer_impl="triton"'
tt mixon_triton 'train.optimizer_impl="triton"' 'compile.inductor."triton.mix_order_reduction"=true'
cd $OUT && tar czf r.tgz r && rm -rf r
