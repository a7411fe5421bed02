# call L: the GPU tests on one H200 (FP8 incl. the head in FP8, fused loss, attention, llama, peer fairness guard)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, torchao, pytest; print(torch.__version__, torchao.__version__, pytest.__version__)" >> $OUT/device.txt
timeout 500 python -m pytest -q -rA --tb=short -p no:cacheprovider tests/integration/test_llama_fp8_gpu.py tests/unit/test_fused_loss.py tests/integration/test_attention_auto.py tests/unit/test_llama.py tests/unit/test_peer_baselines.py > $OUT/gpu_tests.txt 2>&1
echo "rc=$?" >> $OUT/gpu_tests.txt
