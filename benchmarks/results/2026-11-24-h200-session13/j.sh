# call J: llama-1b on one H200. Accelerate FP8 with its optimizer built after prepare (peer.py now) vs as before (the
# optimizer missed the converted weights), turbotrain tensorwise + fp8_head (fused loss off) and tensorwise as shipped
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, torchao, accelerate; print(torch.__version__, torchao.__version__, accelerate.__version__)" >> $OUT/device.txt
L="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/l' precision.fp8=\"tensorwise\""
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]" >> $OUT/summary.txt; }
left() { echo $(( 565 - $(date +%s) + s )); }
for o in before after; do python .gpu/cover.py $o 2>&1 | tail -1 >> $OUT/summary.txt; done; t
P="--framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3"
echo "== accelerate fp8, optimizer after prepare" >> $OUT/summary.txt
timeout $(left) python benchmarks/baselines/peer.py $P > $OUT/acc_fp8.log 2>&1; tail -1 $OUT/acc_fp8.log >> $OUT/summary.txt; t
echo "== tt tensorwise + fp8_head, fused loss off" >> $OUT/summary.txt
timeout $(left) python -m turbotrain train llama-1b $L precision.fp8_head=true kernels.fused_loss=false run.name=head > $OUT/tt_head.log 2>&1
grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_head.log | grep -v "compiling the model" >> $OUT/summary.txt; t
echo "== accelerate fp8 as before (optimizer before prepare)" >> $OUT/summary.txt
timeout $(left) python .gpu/peer_old.py $P > $OUT/acc_fp8_old.log 2>&1; tail -1 $OUT/acc_fp8_old.log >> $OUT/summary.txt; t
echo "== tt tensorwise (shipped: head bf16, fused loss on)" >> $OUT/summary.txt
timeout $(left) python -m turbotrain train llama-1b $L run.name=tw > $OUT/tt_tw.log 2>&1
grep -E "fp8:|step [234]0|compile:|done|rror" $OUT/tt_tw.log | grep -v "compiling the model" >> $OUT/summary.txt; t
