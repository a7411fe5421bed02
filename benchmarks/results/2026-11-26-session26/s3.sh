# session 26 call C (one GPU): the final tree (.gpu/final) — every GPU-marked test
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
echo "== GPU tests"; timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head
cd $OUT && tar czf r.tgz r && rm -rf r
