# session 25 call B (one GPU): the final tree (.gpu/final) — issue 16's ResNet-50 row: the preset's best (coordinate
# descent) against Accelerate and Fabric with their best settings, in one call
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; [ $(left) -lt 60 ] && { echo "skip $name"; return; }; echo "== tt $name"; timeout $(left) python -m turbotrain train "$@" $C run.name=$name > $R/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model" | tail -2; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/summary.json $R/tt_$name.summary.json
  python -c "import json,statistics; v=[r['samples_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
peer() { [ $(left) -lt 60 ] && { echo "skip $1"; return; }; echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py $2 --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
tt resnet_cdt resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
peer acc_resnet "--framework accelerate --workload resnet"
peer fab_resnet "--framework fabric --workload resnet"
cd $OUT && tar czf r.tgz r && rm -rf r
