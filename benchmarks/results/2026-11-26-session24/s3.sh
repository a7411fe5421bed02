# session 24 call 3 (one GPU): deferred log rows — the GPT-2 preset at log_every 1 and 10 on the tree before
# (.gpu/tree, df81404) and after (.gpu/new) in one call, A B B A; each run's summary.json: samples_per_s (timed
# windows, log steps' own work left out) and samples_per_s_overall (with it)
export TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r; ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
cat .gpu/new/COMMIT > $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' compile.cache_dir=/tmp/cc_log"
tt() { tree=$1; name=$2; shift 2; [ $(left) -lt 30 ] && { echo "skip $name"; return; }
  echo "== $tree $name $*"; (cd $ROOT/.gpu/$tree && PYTHONPATH=src timeout $(left) python -m turbotrain train gpt2-124m train.steps=150 "$@" $C run.name=$name > $R/tt_$name.log 2>&1)
  grep -E "step 150/|done|rror" $R/tt_$name.log | tail -2
  cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/summary.json $R/tt_$name.summary.json
  python -c "import json; s=json.load(open('$R/tt_$name.summary.json')); print('   timed', round(s['samples_per_s'],1), 'overall', round(s['samples_per_s_overall'],1), 'wall', round(s['wall_s'],1))"; t; }
tt tree warm train.log_every=10
tt tree old_log1 train.log_every=1
tt new new_log1 train.log_every=1
tt new new_log1b train.log_every=1
tt tree old_log1b train.log_every=1
tt tree old_log10 train.log_every=10
tt new new_log10 train.log_every=10
tt new new_log10b train.log_every=10
tt tree old_log10b train.log_every=10
cd $OUT && tar czf r.tgz r && rm -rf r
