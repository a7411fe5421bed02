# session 27 call 6 (one GPU): the two GPU test files changed after call 5, on the final tree (.gpu/final)
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
timeout 150 python -m pytest -q -p no:cacheprovider tests/integration/test_packed_attention_gpu.py tests/integration/test_attention_auto.py > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR|^E " $R/gpu_tests.txt | head
cd $OUT && tar czf r.tgz r && rm -rf r
