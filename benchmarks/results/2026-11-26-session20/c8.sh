# call 8 (one GPU): more inductor settings on top of the GPT-2 preset as shipped, each through compile.inductor, one call
# (nothing outside compile.inductor changes; the preset twice as the reference)
# and Fabric (best settings) in one call; then inductor settings on top, each through compile.inductor
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
tt shipped
I='compile.inductor.'
tt tensordesc "${I}\"triton.use_tensor_descriptor\"=true"
tt blockptr "${I}\"triton.use_block_ptr\"=true"
tt reads1 "${I}\"realize_reads_threshold\"=1"
tt reads2 "${I}\"realize_reads_threshold\"=2"
tt ndtile "${I}\"triton.prefer_nd_tiling\"=true"
tt tilered "${I}\"triton.tile_reductions\"=true"
tt shipped2
[ $(left) -gt 120 ] && tt autopw "${I}\"max_autotune_pointwise\"=true"
cd $OUT && tar czf r.tgz r && rm -rf r
