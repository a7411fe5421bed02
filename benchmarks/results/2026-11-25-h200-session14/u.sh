# call U: ResNet-50's stem with its input padded to 4/8 channels (microbenchmark); ResNet-50 with inductor's
# multi-kernel (persistent and looped reductions both compiled, the faster picked at run time) vs without, same call
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
echo "== stem"; timeout 150 python .gpu/stem.py > $OUT/stem.txt 2>&1; grep -v Warn $OUT/stem.txt | tail -5; t
G="train.steps=80 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g' compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -m turbotrain train resnet50-synthetic $G run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step (40|80)/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model"; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt ro
TORCHINDUCTOR_MULTI_KERNEL=1 tt mk
