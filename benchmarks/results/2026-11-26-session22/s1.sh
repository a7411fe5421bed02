export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
T=$(python -c "import torch,os;print(os.path.dirname(torch.__file__))")


echo "== side-stream experiment"; set -o pipefail; PYTHONUNBUFFERED=1 timeout 400 python .gpu/side.py 2>&1 | tee $R/side.txt | grep -v Warning; echo "rc=$?"
cd $OUT && tar czf r.tgz r && rm -rf r
