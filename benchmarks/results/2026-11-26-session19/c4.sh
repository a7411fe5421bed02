# call 4: where the GPT-2 preset's GPU idles in steady state (trace of steps 41-55 from a callback), gc off vs on;
# ResNet-50 row with the shipped fused-stem wiring vs Accelerate and Fabric (best settings)
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate, lightning, triton; print(torch.__version__, accelerate.__version__, lightning.__version__, triton.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 580 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror|TRACE|gap|idle by" $OUT/tt_$name.log | grep -v "compiling the model" | tail -16; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
TRACE_OUT=/tmp/trace_gpt.json tt trace python -m turbotrain train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
tt base python -m turbotrain train gpt2-124m train.steps=100
tt gcoff python -c "import gc, sys; gc.disable(); sys.argv[0]='turbotrain'; from turbotrain.cli import main; raise SystemExit(main())" train gpt2-124m train.steps=100
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py $2 --compile-mode reduce-overhead > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log | cut -c1-200; t; }
tt resnet_cdt python -m turbotrain train resnet50-synthetic train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true compile.coordinate_descent_tuning=true
peer acc_resnet "--framework accelerate --workload resnet"
peer fabric_resnet "--framework fabric --workload resnet"
