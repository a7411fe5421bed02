# call S: ResNet-50 on one H200, same call: turbotrain with CUDA graphs (what tune picks) with and without inductor's
# coordinate-descent tuning, Accelerate and plain PyTorch with the same compile mode, channels_last, cudnn.benchmark
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate; print(torch.__version__, accelerate.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
G="train.steps=80 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -m turbotrain train resnet50-synthetic $G run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step (40|80)/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model"; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/$2 --compile-mode reduce-overhead > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log; t; }
tt ro
peer accelerate "peer.py --framework accelerate --workload resnet"
tt cdt compile.coordinate_descent_tuning=true
peer plain plain_resnet.py
