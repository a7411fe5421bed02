# call A: GPU unit tests, GPT-2 profile (which attention kernel runs in the compiled graph), llama rows
python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch,torchao; print(torch.__version__, torchao.__version__); import torch._C as C; print('sdp order', [str(b) for b in C._get_sdp_priority_order()] if hasattr(C,'_get_sdp_priority_order') else 'n/a')"
echo "== gpu tests"; timeout 200 python -m pytest -q -rA -p no:cacheprovider tests/unit/test_fused_loss.py tests/integration/test_llama_fp8_gpu.py tests/integration/test_attention_auto.py 2>&1 | grep -v Warning | tail -40 | tee $OUT/gpu_tests.txt
for att in default cudnn flash; do
 echo "== profile gpt2 attention=$att"
 timeout 150 python -m turbotrain profile gpt2-124m compile.mode='"default"' kernels.attention="\"$att\"" run.out_dir="'/tmp/prof'" run.name=p_$att 2>&1 | tail -45 | tee $OUT/profile_$att.txt
done
ls /tmp/prof/*/ ; cp /tmp/prof/*/profile*.json $OUT/ 2>/dev/null; true
