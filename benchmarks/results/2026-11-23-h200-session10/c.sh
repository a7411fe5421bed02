python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
echo "== attention under compile"; TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 150 python .gpu/attn.py 2>&1 | grep -v Warn | tee $OUT/attn.txt
LL="train.steps=40 train.log_every=10 data.eval_batches=0 checkpoint.every=0 precision.fp8=\"tensorwise\" run.out_dir='/tmp/l'"
echo "== tt tensorwise, every linear divisible by 16 (untied)"; timeout 200 python -c "
import sys, turbotrain.accel.fp8 as f
f.fp8_filter = lambda recipe, skip: (lambda m, fqn: id(m.weight) not in skip and m.in_features % 16 == 0 and m.out_features % 16 == 0)
from turbotrain.cli import main; sys.exit(main(sys.argv[1:]))" train llama-1b $LL run.name=all 2>&1 | grep -E "fp8:|step [234]0|compile:|done" | tee $OUT/tt_tensorwise_all.txt
echo "== tt tensorwise, torchao size filter"; timeout 200 python -m turbotrain train llama-1b $LL run.name=size 2>&1 | grep -E "fp8:|step [234]0|compile:|done" | tee $OUT/tt_tensorwise_size.txt
echo "== accelerate fp8"; timeout 200 python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8 --steps 30 --warmup-steps 5 --windows 3 2>&1 | tail -1 | tee $OUT/accelerate_llama_fp8.txt
