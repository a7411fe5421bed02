# call D (session 18, one GPU): GPU tests of the convnet kernels after folding the max pool and the fused layer
# into one Triton module (pool_kernels.py)
export PYTHONPATH=src
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
git log -1 --format=%H >> $OUT/device.txt 2>/dev/null
timeout 175 python -m pytest -q -m gpu tests/unit/test_convnet.py tests/unit/test_bn_relu_pool.py -p no:cacheprovider --durations=5 > $OUT/tests.log 2>&1; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | head -12
