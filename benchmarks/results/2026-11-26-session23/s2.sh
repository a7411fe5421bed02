# session 23 call 2 (one GPU): issue 16's ResNet-50 row on the tree after the red-team fixes, against Accelerate and Fabric
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, accelerate, lightning, triton; print(torch.__version__, accelerate.__version__, lightning.__version__, triton.__version__)" >> $R/device.txt
cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) python -m turbotrain train "$@" $C run.name=$name > $R/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/config.toml $R/tt_$name.config.toml; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py $2 --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
tt resnet_cdt resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
peer acc_resnet "--framework accelerate --workload resnet"
peer fabric_resnet "--framework fabric --workload resnet"
tt resnet_cdt2 resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
cd $OUT && tar czf r.tgz r && rm -rf r
