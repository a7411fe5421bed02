# call A (session 18, one GPU): GPU tests of the convnet kernels (the refactored pool, the fused batch norm + ReLU
# + max pool); the fused stem section in isolation with a block sweep; ResNet-50 through turbotrain with the fusion
# on vs off (CUDA graphs, no coordinate descent), same call
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate, lightning, triton; print(torch.__version__, accelerate.__version__, lightning.__version__, triton.__version__)" >> $OUT/device.txt
git log -1 --format=%H >> $OUT/device.txt 2>/dev/null
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 570 - $(date +%s) + s )); }
echo "== gpu tests"; timeout 200 python -m pytest -q -m gpu tests/unit/test_convnet.py tests/unit/test_bn_relu_pool.py -p no:cacheprovider -x > $OUT/tests.log 2>&1; tail -15 $OUT/tests.log | grep -E "passed|failed|Error|error|assert" | head -12; t
echo "== micro"; timeout 150 python .gpu/fused.py > $OUT/fused.log 2>&1; grep -E "^(inductor|pool|fused|pieces)" $OUT/fused.log; tail -2 $OUT/fused.log; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' train.steps=70 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -c "import sys; import turbotrain.accel.convnet.bn_relu_pool as b
if sys.argv[1] == 'nofuse': b.available = lambda: False
from turbotrain.cli import main; sys.exit(main(sys.argv[2:]))" $1 train resnet50-synthetic $C run.name=$name > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|convnet|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt fused fuse
tt unfused nofuse
