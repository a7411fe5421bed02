export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
cat $OUT/device.txt
s=$(date +%s)
echo "== mlp.py"; timeout 300 python .gpu/mlp.py 2>&1 | tee $OUT/mlp.txt | grep -v Warning | tail -60; echo "[$(( $(date +%s) - s )) s]"
echo "== gpu tests of the fused stem (container wiring)"
timeout 220 python -m pytest -q -m gpu tests/unit/test_bn_relu_pool.py -x 2>&1 | tail -15 | tee $OUT/gpu_tests.txt; echo "[$(( $(date +%s) - s )) s]"
