# session 24 call 5 (one GPU): the final tree (.gpu/final) — every GPU-marked test, then issue 16's ResNet-50 row
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
echo "== GPU tests"; timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -3 $R/gpu_tests.txt; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; [ $(left) -lt 60 ] && { echo "skip $name"; return; }; echo "== tt $name"; timeout $(left) python -m turbotrain train "$@" $C run.name=$name > $R/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model" | tail -2; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; t; }
peer() { [ $(left) -lt 60 ] && { echo "skip $1"; return; }; echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py $2 --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
tt resnet_cdt resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
peer acc_resnet "--framework accelerate --workload resnet"
cd $OUT && tar czf r.tgz r && rm -rf r
