# call M: llama-1b tensorwise + fp8_head (fused loss off) with compile.coordinate_descent_tuning, the call to itself
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\""
s=$(date +%s)
timeout 580 python -m turbotrain train llama-1b $L precision.fp8_head=true kernels.fused_loss=false compile.coordinate_descent_tuning=true run.name=cdt > $OUT/tt_cdt.log 2>&1
echo "rc=$? after $(( $(date +%s) - s )) s" >> $OUT/tt_cdt.log
