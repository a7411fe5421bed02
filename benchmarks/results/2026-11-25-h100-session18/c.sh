# call C (session 18, one GPU): ResNet-50 through turbotrain, the fused batch norm + ReLU + max pool on vs off
# (swept tiles; CUDA graphs, no coordinate descent; everything else of kernels.convnet on in both), same call
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 280 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' train.steps=60 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -c "import sys; import turbotrain.accel.convnet.bn_relu_pool as b
if sys.argv[1] == 'nofuse': b.available = lambda: False
from turbotrain.cli import main; sys.exit(main(sys.argv[2:]))" $1 train resnet50-synthetic $C run.name=$name > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|convnet|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt fused fuse
tt unfused nofuse
