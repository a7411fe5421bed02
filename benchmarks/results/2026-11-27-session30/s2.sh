# session 30 call 2 (one GPU): every GPU-marked test on the weight-copies tree, then exp30.py (cuDNN attention plans)
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
echo "== exp30"; timeout 150 python ../exp30.py > $R/exp30.txt 2>&1; echo "rc=$?"; cat $R/exp30.txt | cut -c1-200 | head -40; t
echo "== GPU tests"; timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR" $R/gpu_tests.txt | head; t
cd $OUT && tar czf r.tgz r && rm -rf r
