# call P: where a compiled GPT-2 124M / ResNet-50 step goes, kernel by kernel, and how fast inductor's own kernels
# run against HBM bandwidth; the head + cross-entropy in isolation (unfused compiled vs fused, default vs one chunk)
export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch; print(torch.__version__)" >> $OUT/device.txt
git rev-parse HEAD >> $OUT/device.txt 2>/dev/null
s=$(date +%s); left() { echo $(( 580 - $(date +%s) + s )); }
P="run.out_dir='/tmp/prof'"
echo "== ce.py"; timeout 150 python .gpu/ce.py > $OUT/ce.txt 2>&1; tail -3 $OUT/ce.txt; echo "[$(( $(date +%s) - s )) s]"
for v in default reduce-overhead; do
  echo "== profile gpt2 $v"
  timeout 120 python -m turbotrain profile gpt2-124m compile.mode="\"$v\"" $P run.name=g_$v > $OUT/profile_gpt_$v.txt 2>&1
  python .gpu/kern.py /tmp/prof/g_$v/profile/trace.json.gz 5 > $OUT/kern_gpt_$v.txt 2>&1; head -8 $OUT/kern_gpt_$v.txt
  grep "Median step" $OUT/profile_gpt_$v.txt; echo "[$(( $(date +%s) - s )) s]"
done
echo "== profile resnet50 default"
timeout 150 python -m turbotrain profile resnet50-synthetic compile.enabled=true compile.mode='"default"' $P run.name=r > $OUT/profile_resnet.txt 2>&1
python .gpu/kern.py /tmp/prof/r/profile/trace.json.gz 5 > $OUT/kern_resnet.txt 2>&1; head -8 $OUT/kern_resnet.txt
grep "Median step" $OUT/profile_resnet.txt; echo "[$(( $(date +%s) - s )) s]"
echo "== inductor bandwidth, gpt2 (compile default, fresh compile)"
TORCHINDUCTOR_PROFILE=1 TORCHINDUCTOR_PROFILE_OUTPUT=$OUT/bw_gpt.txt TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TURBOTRAIN_CACHE=/tmp/c2 \
  timeout $(left) python -m turbotrain train gpt2-124m train.steps=3 compile.mode='"default"' data.eval_batches=0 checkpoint.every=0 \
  checkpoint.final=false $P run.name=bw > $OUT/bw_gpt.log 2>&1
tail -5 $OUT/bw_gpt.log; ls -la $OUT; echo "[$(( $(date +%s) - s )) s]"
