# session 31 call 1 (one GPU): exp31.py — cuBLASLt kernels for the MLP epilogue GEMMs per operand layout; wgrad GEMMs
cd .gpu/final; export PYTHONPATH=src:..:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__, 'cudnn', torch.backends.cudnn.version(), 'cuda', torch.version.cuda)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
timeout 240 python ../exp31.py > $R/exp31.txt 2>&1; echo "rc=$?"; cut -c1-330 $R/exp31.txt
