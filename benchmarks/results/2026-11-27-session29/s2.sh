# session 29 call 2 (one GPU): AdamW kernel variants (exp29b.py)
cd .gpu/final; export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt; cat $R/device.txt
timeout 400 python ../exp29b.py 2>&1 | tee $R/variants.log | grep -E "^b |rror"
cd $OUT && tar czf r.tgz r && rm -rf r
