# session 22 call 2: inductor's CUTLASS backend on GPT-2's GEMM shapes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; which nvcc >> $R/device.txt; nvcc --version | tail -2 >> $R/device.txt; cat $R/device.txt
C=/tmp/cutlass; mkdir -p $C/python; S=/tmp/site/cutlass_library/source
ln -s $S/include $C/include; ln -s $S/tools $C/tools; ln -s /tmp/site/cutlass_library $C/python/cutlass_library; ln -s /tmp/site/cutlass_cppgen $C/python/cutlass_cppgen
export TORCHINDUCTOR_CUTLASS_DIR=$C
T=$(python -c "import torch,os;print(os.path.dirname(torch.__file__))"); ls $T/_inductor/codegen/cuda/ | head -20 > $R/inductor_cuda.txt
set -o pipefail
NCFG=${NCFG:-6} PYTHONUNBUFFERED=1 timeout 520 python .gpu/cut.py "$@" 2>&1 | tee $R/cut.txt | grep -v "Warning\|warn(" | cut -c1-400; echo "rc=$?"
cd $OUT && tar czf r.tgz r && rm -rf r
