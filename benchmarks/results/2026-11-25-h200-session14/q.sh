# call Q: the fused loss's row kernel swept (block, warps, L2 hints); ResNet's stem max pool eager vs inductor;
# ResNet-50 with CUDA graphs, inductor's coordinate-descent tuning off vs on (same call, one H200)
export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
git rev-parse HEAD >> $OUT/device.txt 2>/dev/null
s=$(date +%s); left() { echo $(( 585 - $(date +%s) + s )); }
echo "== rows"; timeout 120 python .gpu/rows.py > $OUT/rows.txt 2>&1; cat $OUT/rows.txt; echo "[$(( $(date +%s) - s )) s]"
echo "== pool"; timeout 60 python .gpu/pool.py > $OUT/pool.txt 2>&1; cat $OUT/pool.txt; echo "[$(( $(date +%s) - s )) s]"
G="train.steps=60 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
for v in ro cdt; do
  echo "== resnet $v"
  timeout $(left) python -m turbotrain train resnet50-synthetic $G run.name=$v $([ $v = cdt ] && echo compile.coordinate_descent_tuning=true) > $OUT/resnet_$v.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $OUT/resnet_$v.log | grep -v "compiling the model"; echo "[$(( $(date +%s) - s )) s]"
done
