# call 7 (one GPU): the fused loss's row kernel in one pass (row held in registers) vs as shipped, in isolation
export PYTHONPATH=src
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
timeout 300 python .gpu/rows3.py 2>&1 | tee $R/rows3.txt
cd $OUT && tar czf r.tgz r && rm -rf r
