# call B (session 18, one GPU): the fused layer's GPU tests with the swept tiles; issue 16's ResNet-50 row:
# turbotrain (kernels.convnet auto = on: 16-channel space-to-depth stem + fused batch norm/ReLU/max pool;
# coordinate-descent tuning; CUDA graphs; device-resident data) vs Accelerate and Fabric with their best settings
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate, lightning, triton; print(torch.__version__, accelerate.__version__, lightning.__version__, triton.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 575 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; preset=$2; shift 2; echo "== tt $name"; timeout $(left) python -m turbotrain train $preset $C run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|convnet|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -4; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py $2 --compile-mode reduce-overhead > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log | cut -c1-200; t; }
echo "== gpu tests"; timeout 60 python -m pytest -q -m gpu tests/unit/test_bn_relu_pool.py -p no:cacheprovider > $OUT/tests.log 2>&1; grep -E "passed|failed|FAILED" $OUT/tests.log | head -5; t
tt resnet_cdt resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
peer acc_resnet "--framework accelerate --workload resnet"
peer fabric_resnet "--framework fabric --workload resnet"
