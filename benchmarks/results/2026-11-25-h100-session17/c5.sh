# call 5 (session 17, one GPU): ResNet-50 through turbotrain with kernels.convnet off vs on (CUDA graphs, no
# coordinate descent), then a kernel profile with it on (compile default, as session 14's call P)
export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 415 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' train.steps=70 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -m turbotrain train resnet50-synthetic $C run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|convnet|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt convnet_on
tt convnet_off kernels.convnet=false
echo "== profile"; timeout $(left) python -m turbotrain profile resnet50-synthetic compile.enabled=true compile.mode='"default"' run.out_dir="'/tmp/prof'" run.name=r > $OUT/profile_resnet.txt 2>&1
python .gpu/kern.py /tmp/prof/r/profile/trace.json.gz 5 > $OUT/kern_resnet.txt 2>&1; head -8 $OUT/kern_resnet.txt; grep "Median step" $OUT/profile_resnet.txt; t
