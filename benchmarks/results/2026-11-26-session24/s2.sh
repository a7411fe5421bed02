# session 24 call 2 (one GPU): what logging costs the GPT-2 preset end to end — log_every 1 / 10 / 50, each run's
# summary.json (samples_per_s: the timed windows, log steps' own work left out; samples_per_s_overall: with it)
cd .gpu/tree; export PYTHONPATH=src:benchmarks/baselines:.. TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
echo df81404 > $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' compile.cache_dir=/tmp/cc_log"
tt() { name=$1; shift 1; [ $(left) -lt 40 ] && { echo "skip $name"; return; }
  echo "== tt $name $*"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=150 "$@" $C run.name=$name > $R/tt_$name.log 2>&1
  grep -E "step 150/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -3
  cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/summary.json $R/tt_$name.summary.json
  python -c "import json; s=json.load(open('$R/tt_$name.summary.json')); print('   ', {k: s.get(k) for k in ('samples_per_s','samples_per_s_overall','tokens_per_s','timed_steps','wall_s')})"; t; }
tt log10a train.log_every=10
tt log1 train.log_every=1
tt log50 train.log_every=50
tt log10b train.log_every=10
tt log1b train.log_every=1
cd $OUT && tar czf r.tgz r && rm -rf r
