# call 1 (one GPU): GPT-2 preset, inductor knobs that add no math: PDL, mix-order reduction off / split autotuned,
# combo kernels; a kernel-by-kernel trace of the preset as shipped; Accelerate in the same call
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate; print(torch.__version__, triton.__version__, accelerate.__version__)" >> $R/device.txt; cat $R/device.txt
python -c "import torch._inductor.config as c; print('pdl', c.triton.enable_pdl, 'mix_order', getattr(c.triton,'mix_order_reduction',None), 'combo', c.combo_kernels)"
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
CFG() { echo "import sys, torch._inductor.config as c; $1; sys.argv[0] = 'turbotrain'; from turbotrain.cli import main; raise SystemExit(main())"; }
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|done|rror|TRACE|idle by" $R/tt_$name.log | grep -v "compiling the model" | tail -4; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
tt base python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_ENABLE_PDL=1 tt pdl python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 tt mor0 python -m turbotrain train gpt2-124m train.steps=100
TORCHINDUCTOR_MIX_ORDER_REDUCTION_AUTOTUNE_SPLIT_SIZE=1 tt morsplit python -m turbotrain train gpt2-124m train.steps=100
tt combo python -c "$(CFG 'c.combo_kernels = True')" train gpt2-124m train.steps=100
TRACE_OUT=/tmp/trace_gpt.json tt trace python -m turbotrain train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
python .gpu/kern2.py /tmp/trace_gpt.json 15 > $R/kern_base.txt; head -45 $R/kern_base.txt
echo "== acc"; timeout $(left) python benchmarks/baselines/peer.py --framework accelerate --workload gpt --compile-mode reduce-overhead > $R/acc.log 2>&1; tail -1 $R/acc.log | cut -c1-250; t
tt base2 python -m turbotrain train gpt2-124m train.steps=100
cd $OUT && tar czf r.tgz r && rm -rf r
