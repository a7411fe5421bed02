# call 6 (one GPU): experiment, not shipped: the plain GPT-2 loop (reduce-overhead) vs the same with bf16 weights in the
# model and fp32 masters in the optimizer (no per-step casts), A B A B in one process (bf16w.py)
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
timeout 400 python .gpu/bf16w.py --compile-mode reduce-overhead 2>&1 | tee $R/bf16w.txt | cut -c1-200
cd $OUT && tar czf r.tgz r && rm -rf r
