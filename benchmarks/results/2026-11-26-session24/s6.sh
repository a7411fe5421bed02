# session 24 call 6 (one GPU): profile's host-read count on a GPU (.cpu() in the loss, .item() x 8, a clean loss),
# and the profile/planted GPU tests
cd .gpu/final; export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
timeout 400 python -m pytest -q -m gpu -p no:cacheprovider tests/faults/test_redteam_s23_tools.py tests/faults/test_planted_s22.py tests/integration/test_profile_verdicts.py tests/integration/test_profile.py > $R/gpu_tests.txt 2>&1; echo "rc=$?"; grep -E "passed|failed|^E  |^FAILED" $R/gpu_tests.txt | head -20
cd $OUT && tar czf r.tgz r && rm -rf r
