# session 31 call 6 (one GPU): exp31d.py — cuBLASLt's candidates for the LM head's three GEMMs
cd .gpu/final; export PYTHONPATH=src:..:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt; cp COMMIT $R/commit.txt
timeout 200 python ../exp31d.py > $R/exp31d.txt 2>&1; echo "rc=$?"; grep -v Warn $R/exp31d.txt | cut -c1-260
