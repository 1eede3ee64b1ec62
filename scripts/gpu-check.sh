#!/usr/bin/env bash
# One prepared check for a lent CUDA machine: `bash scripts/gpu-check.sh` (steps: tev/drive/gpu_check.py).
# Results land in $OUT (else runs/gpu-check): gpu-check.md (summary), gpu-check.json, pytest.log,
# gpu-check.log (this console). Exits non-zero when any step failed or the whole run timed out.
#
# The lent machine has python3 3.12 with torch 2.11 and transformers 5.17, and no network. The
# engine needs transformers >= 5.24 (requirements.txt): older versions do not know forward's
# `cache=` argument and silently run every forward without the KV cache. So carry newer wheels in
# .whl/ (git ignores it: name it in the device run's `carry`). Prepare it, anywhere with PyPI, with:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --abi cp312 --platform manylinux2014_x86_64 -d .whl "transformers==5.24.0" "huggingface_hub==1.33.0"
#
# (transformers 5.24 checks huggingface_hub >= 1.31 at import; 1.33 is the newest 1.x, on httpx like
# the machine's own 1.x. tokenizers, safetensors and accelerate there already fit. No step needs
# gradio, plotly or gguf, so none is carried.) Nothing here installs from a network.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR="${OUT:-runs/gpu-check}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

if [ -d .whl ] && compgen -G ".whl/*.whl" > /dev/null; then
    echo "installing carried wheels: $(cd .whl && echo *.whl)"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || echo "warning: the carried wheels did not install"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

timeout 480 python3 -m tev.drive.gpu_check --out "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu-check.log"  # "$@": e.g. --only greedy
status=$?
[ "$status" -eq 124 ] && echo "gpu-check: killed at 480 s; the steps finished so far are in $OUT_DIR/gpu-check.md"
echo
cat "$OUT_DIR/gpu-check.md" 2> /dev/null
exit "$status"
