# call K: llama-1b on one H200, the repeat of call J's ratio plus Accelerate's other FP8 setting: Accelerate FP8
# (optimizer after prepare), the same with ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER=false (plain weight
# Parameters, no float8-cast wrapper), turbotrain tensorwise + fp8_head (fused loss off), Accelerate bf16 + dynamo
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, torchao, accelerate; print(torch.__version__, torchao.__version__, accelerate.__version__)" >> $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\""
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
left() { echo $(( 565 - $(date +%s) + s )); }
P="--framework accelerate --workload llama --steps 30 --warmup-steps 5 --windows 3"
echo "== accelerate fp8 (optimizer after prepare)" >> $OUT/summary.txt
timeout $(left) python benchmarks/baselines/peer.py $P --fp8 > $OUT/acc_fp8.log 2>&1; tail -1 $OUT/acc_fp8.log >> $OUT/summary.txt; t
echo "== tt tensorwise + fp8_head, fused loss off" >> $OUT/summary.txt
timeout $(left) python -m turbotrain train llama-1b $L precision.fp8_head=true kernels.fused_loss=false run.name=head > $OUT/tt_head.log 2>&1
grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_head.log | grep -v "compiling the model" >> $OUT/summary.txt; t
echo "== accelerate fp8, FSDP float8 all-gather off" >> $OUT/summary.txt
ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER=false timeout $(left) python benchmarks/baselines/peer.py $P --fp8 > $OUT/acc_fp8_noag.log 2>&1
tail -1 $OUT/acc_fp8_noag.log >> $OUT/summary.txt; t
echo "== accelerate bf16" >> $OUT/summary.txt
timeout $(left) python benchmarks/baselines/peer.py $P > $OUT/acc_bf16.log 2>&1; tail -1 $OUT/acc_bf16.log >> $OUT/summary.txt; t
