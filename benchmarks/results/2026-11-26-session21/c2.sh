# session 21 call 2 (one GPU): experiment, not shipped: GPT-2's GEMM shapes alone, cuBLAS vs inductor's Triton
# templates (max-autotune, persistent TMA), gemm.py
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
python -c "import torch,triton;print(torch.__version__, triton.__version__)" >> $R/device.txt
timeout 540 python .gpu/gemm.py 2> $R/gemm.err | tee $R/gemm.txt
grep -i "autotune\|triton_\|mm " $R/gemm.err | grep -v Warn | head -150 > $R/autotune.txt
gzip $R/gemm.err
cd $OUT && tar czf r.tgz r && rm -rf r
