python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
echo "== gpu tests"; timeout 200 python -m pytest -q --tb=short -p no:cacheprovider -p no:logging tests/integration/test_attention_auto.py tests/integration/test_llama_fp8_gpu.py tests/unit/test_fused_loss.py tests/unit/test_attention.py 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | head -30 | tee $OUT/gpu_tests.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 run.out_dir='/tmp/l'"
for p in off tensorwise; do echo "== tt llama fp8=$p"; timeout 170 python -m turbotrain train llama-1b $L precision.fp8=\"$p\" run.name=$p 2>&1 | grep -E "fp8:|step [234]0|compile:|done" | tee $OUT/tt_llama_$p.txt; done
echo "== accelerate bf16"; timeout 170 python benchmarks/baselines/peer.py --framework accelerate --workload llama --steps 30 --warmup-steps 5 --windows 3 2>&1 | tail -1 | tee $OUT/accelerate_llama.txt
