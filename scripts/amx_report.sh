#!/usr/bin/env bash
# For whoever owns an AMX machine (Intel Sapphire Rapids or newer): build the amx recipe,
# run the MoE suite on real tiles, and measure the tile kernels against AVX-512.
# Prints one table at the end; paste it (and build/amx_report.json) into an issue.
#   ./scripts/amx_report.sh            (from the ktforge checkout, after ./install.sh deps)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python

echo "== kt doctor (AMX gates)"
"$PY" -m ktforge doctor --check amx.cpuid --check amx.xcr0 --check amx.kernel --check amx.permission \
  --check amx.execution || { echo "AMX is not usable here: see above"; exit 1; }

echo "== kt build --recipe amx"
./install.sh build --recipe amx

echo "== the MoE suite on real tiles"
"$PY" -m pip install -q -r tests/requirements.txt
"$PY" -m pytest -q tests/kernels/test_moe_correctness.py tests/kernels/test_tile_model.py tests/kernels/test_fp8.py \
  -p no:cacheprovider

echo "== kt bench --backend amx,avx512"
mkdir -p build
"$PY" -m ktforge bench --backend amx,avx512 --method bf16,int8,int8g,int4 --group-size 32 --tokens 1,4,16,32,128,512 \
  --routing uniform --json > build/amx_report.json
# fp8 at the group of the FP8 checkpoints (128 x 128 blocks)
"$PY" -m ktforge bench --backend amx,avx512 --method fp8 --group-size 128 --tokens 1,4,16,32,128,512 \
  --routing uniform --json > build/amx_report_fp8.json
"$PY" - <<'PY'
import json
d = json.load(open("build/amx_report.json"))
d["results"] += json.load(open("build/amx_report_fp8.json"))["results"]
for backend, by_threads in d["peaks"].items():  # backend -> threads -> peak -> value
    for threads, peaks in by_threads.items():
        print(f"peaks {backend} {threads} threads:", {k: round(v) for k, v in peaks.items()})
rows = {}
for r in d["results"]:
    rows.setdefault((r["method"], r["tokens"]), {})[r["backend"]] = r
print(f"{'method':6} {'tokens':>6} {'amx ms':>9} {'avx512 ms':>10} {'avx512/amx':>10}  amx kernel")
for (method, tokens), by in sorted(rows.items()):
    amx, avx = by.get("amx"), by.get("avx512")
    if amx and avx:
        print(f"{method:6} {tokens:6} {amx['ms']:9.2f} {avx['ms']:10.2f} {avx['ms'] / amx['ms']:9.2f}x  {amx['kernel']}")
PY

echo "== where the tiles win, per format and tokens per expert (the kAmx*MinRows of native/src/arch/x86/amx/kernels.cpp)"
"$PY" scripts/tile_crossover.py --tokens 8,16,32,64,128
"$PY" scripts/tile_crossover.py --methods int4,int8g,int4z --group-size 32 --tokens 32,128
