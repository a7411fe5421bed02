# session 21 call 1 (one GPU): experiment, not shipped: plain GPT-2 loop (reduce-overhead) vs the clip + AdamW step
# compiled by inductor (default mode; reduce-overhead) vs cuBLASLt preferred, A B D C twice in one process (optc.py)
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
python -c "import torch,triton;print(torch.__version__, triton.__version__)" >> $R/device.txt
git log -1 --format=%H >> $R/device.txt 2>/dev/null
timeout 560 python .gpu/optc.py --compile-mode reduce-overhead 2>&1 | tee $R/optc.txt | grep -v Warn | cut -c1-260
cd $OUT && tar czf r.tgz r && rm -rf r
