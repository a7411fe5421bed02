export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
git log -1 --format=%H >> $OUT/device.txt 2>/dev/null
timeout 560 python .gpu/micro.py 2>&1 | grep -v Warning > $OUT/micro.log; tail -30 $OUT/micro.log
