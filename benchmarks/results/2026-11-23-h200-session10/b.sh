python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
echo "== fp8 tests"; timeout 120 python -m pytest -q --tb=short -p no:cacheprovider -p no:logging tests/integration/test_llama_fp8_gpu.py -k tracks 2>&1 | grep -E "assert|Error|error|==|approx|cosine|where" | head -40 | tee $OUT/fp8_tests.txt
echo "== profile gpt2 flash, no shared cache"; TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 150 python -m turbotrain profile gpt2-124m compile.mode='"default"' kernels.attention='"flash"' compile.cache=false run.out_dir="'/tmp/prof'" run.name=p_flash_cold 2>&1 | grep -E "Median|sdpa|flash|cudnn|attention" | tee $OUT/profile_flash_cold.txt
for row in "accelerate_llama:--steps 30 --warmup-steps 5 --windows 3" "accelerate_llama_fp8:--fp8 --steps 30 --warmup-steps 5 --windows 3"; do n=${row%%:*}; a=${row#*:}
 echo "== $n"; timeout 200 python benchmarks/baselines/peer.py --framework accelerate --workload llama $a 2>&1 | tail -3 | tee $OUT/$n.txt; done
echo "== tt tensorwise"; timeout 200 python -m turbotrain train llama-1b train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 precision.fp8='"tensorwise"' run.out_dir="'/tmp/l'" run.name=llama_fp8_tensorwise 2>&1 | grep -vi warn | tail -8 | tee $OUT/tt_tensorwise.txt
