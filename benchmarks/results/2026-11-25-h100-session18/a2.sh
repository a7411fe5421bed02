# call A2 (session 18, one GPU): GPU tests of the convnet kernels; launch-shape sweep of the fused kernels
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
echo "== gpu tests"; timeout 220 python -m pytest -q -m gpu tests/unit/test_bn_relu_pool.py tests/unit/test_convnet.py -p no:cacheprovider --durations=8 > $OUT/tests.log 2>&1; grep -E "passed|failed|Error|assert|^[0-9.]+s " $OUT/tests.log | head -20; t
echo "== sweep"; SWEEP_S=150 timeout 200 python .gpu/sweep.py > $OUT/sweep.log 2>&1; cat $OUT/sweep.log | cut -c1-400 | tail -8; t
