python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
echo "== gpu tests"; timeout 240 python -m pytest -q --tb=short -p no:cacheprovider -p no:logging tests/integration/test_attention_auto.py tests/integration/test_llama_fp8_gpu.py tests/unit/test_fused_loss.py tests/unit/test_llama.py 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -30 | tee $OUT/gpu_tests.txt
echo "== profile gpt2 flash"; timeout 120 python -m turbotrain profile gpt2-124m compile.mode='"default"' kernels.attention='"flash"' run.out_dir="'/tmp/prof'" run.name=p_flash 2>&1 | grep -E "attention|Median|sdpa|pytorch_flash|fmha" | tee $OUT/profile_flash.txt
LL="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 precision.fp8=\"tensorwise\" run.out_dir='/tmp/l'"
echo "== tt tensorwise fused loss off"; timeout 200 python -m turbotrain train llama-1b $LL kernels.fused_loss=false run.name=nofuse 2>&1 | grep -E "fp8:|step [234]0|compile:|done" | tee $OUT/tt_tensorwise_nofuse.txt
echo "== accelerate fp8"; timeout 200 python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3 2>&1 | tail -1 | tee $OUT/accelerate_llama_fp8.txt
