#!/usr/bin/env bash
# GPU ground truth in one go, on a machine with an NVIDIA GPU (each step time-limited: at most 8 minutes in all):
#
#   bash benchmarks/gpu_truth.sh            # from the repository root, jaxmem installed (pip install -e .)
#   bash benchmarks/gpu_truth.sh --bundle DIR
#       on a machine with its own jax stack and no network: first installs the wheels that
#       `python benchmarks/gpu_bundle.py DIR` built elsewhere (jaxmem, qwix) with
#       pip install --no-index --no-deps --target, keeping the machine's jax, plugin and flax
#
# 0. the bundle's install (with --bundle), and the stack it runs on -> results/gpu/versions.txt
# 0b. one deviceless analysis (no GPU needed)  -> results/gpu/analyze.json
# 1. jaxmem doctor --require-gpu            -> results/gpu/doctor.{json,txt}
# 2. jaxmem calibrate --gpu local           -> results/gpu/calibration.json (this run's calibration file) + calibrate.json
# 3. python benchmarks/accuracy.py --gpu    -> results/accuracy-gpu.md (+ results/gpu/accuracy.log)
# 4. one monitored jaxmem verify            -> results/gpu/verify.{json,html,txt} (NVML min/median/max, trace, throttling)
#
# Steps 3 and 4 predict with the calibration of step 2 (JAXMEM_CALIBRATION points at it), so
# the runtime terms in their predictions are measured on this card, not estimated. Each step has
# a time limit so that the whole script stays within 8 minutes; a step that fails or runs out of
# time is recorded in results/gpu/summary.txt and the script goes on. On a machine without a GPU
# (NVML finds none) steps 1-4 are recorded as skipped: what needs no GPU still runs (the install,
# the deviceless analysis). Exit code: 0 when every step that ran succeeded, 1 otherwise.
set -u
cd "$(dirname "$0")/.."
BUNDLE=""
if [[ "${1:-}" == "--bundle" ]]; then
  BUNDLE=${2:?"--bundle needs the folder that benchmarks/gpu_bundle.py wrote"}
  BUNDLE=$(cd "$BUNDLE" && pwd)
fi
OUT=benchmarks/results/gpu
mkdir -p "$OUT"
export JAXMEM_CALIBRATION="$PWD/$OUT/calibration.json"
rm -f "$JAXMEM_CALIBRATION"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0
t_all=$(date +%s)

GPU_STEPS="doctor calibrate accuracy verify"
# step NAME LIMIT_S OK_CODES COMMAND...: run with a time limit, record exit code and seconds
step() {
  local name=$1 limit=$2 ok=$3; shift 3
  local t0 rc
  if [[ "${HAVE_GPU:-1}" == 0 && " $GPU_STEPS " == *" $name "* ]]; then
    echo "== $name: skipped (no GPU)" | tee -a "$SUMMARY"
    return
  fi
  t0=$(date +%s)
  echo "== $name: $*" | tee -a "$SUMMARY"
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [[ " $ok " == *" $rc "* ]]; then
    echo "   $name: exit $rc in ${dt} s" | tee -a "$SUMMARY"
  else
    [[ $rc == 124 || $rc == 137 ]] && rc="$rc (ran past ${limit} s)"
    echo "   $name: FAILED, exit $rc in ${dt} s" | tee -a "$SUMMARY"
    status=1
  fi
}

# 0. the bundle: jaxmem and what the machine lacks, beside (not over) its own jax stack
if [[ -n "$BUNDLE" ]]; then
  SITE=$(mktemp -d /tmp/jaxmem-site.XXXXXX)
  step install 120 "0" python -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" "$BUNDLE"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
fi
python -c "import jaxmem.compiler.versions as v; print(v.installed())" 2>&1 | tee "$OUT/versions.txt"
step analyze 120 "0 3" bash -c "jaxmem analyze models/llama.py --arg preset=tiny --gpu h200 --mesh data=8 --batch 8 --json > $OUT/analyze.json"
if python -c "import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0" 2>/dev/null; then
  HAVE_GPU=1
else
  HAVE_GPU=0
  echo "   no GPU here (NVML finds none): doctor, calibrate, accuracy and verify skipped" | tee -a "$SUMMARY"
fi

# 1. the stack (exit 3 = a check failed: recorded, the rest still runs)
step doctor 60 "0" bash -c "jaxmem doctor --require-gpu --json > $OUT/doctor.json"
[[ -s "$OUT/doctor.json" ]] && python - "$OUT/doctor.json" > "$OUT/doctor.txt" <<'PY'
import json, sys
from jaxmem.truth import doctor
d = json.load(open(sys.argv[1]))
print("\n".join(doctor.render_lines(doctor.Diagnosis(tuple(doctor.Check(**c) for c in d["checks"])))))
PY
cat "$OUT/doctor.txt" 2>/dev/null

# 2. the runtime terms of this card
step calibrate 60 "0" bash -c "jaxmem calibrate --gpu local --json > $OUT/calibrate.json"
cat "$OUT/calibrate.json" 2>/dev/null | head -40

# 3. predicted vs measured over the accuracy cases (one measured run per case keeps it within the budget)
step accuracy 275 "0" bash -c "python benchmarks/accuracy.py --gpu --repeats 1 --out benchmarks/results/accuracy-gpu.md > $OUT/accuracy.log 2>&1"
tail -5 "$OUT/accuracy.log" 2>/dev/null

# 4. one verify, watched through NVML (GPT-2 small, batch 16 x 1024 tokens: a step long enough to sample)
VERIFY=(jaxmem verify models/gpt2.py --arg preset=gpt2 --arg batch_size=16 --gpu local --mesh data=1 --layout dp)
step verify 75 "0" bash -c "${VERIFY[*]} --json --html $OUT/verify.html > $OUT/verify.json"
[[ -s "$OUT/verify.json" ]] && python - "$OUT/verify.json" <<'PY' | tee "$OUT/verify.txt"
import json, sys
from jaxmem.truth.monitor import monitor_lines
v = json.load(open(sys.argv[1]))
print(f"{v['model']}: predicted {v['predicted_peak_bytes']:,} B, measured {v['measured_peak_bytes']:,} B, "
      f"error {v['relative_error']:+.2%}")
print("\n".join(monitor_lines(v.get("monitor")) + [f"warning: {w}" for w in v.get("warnings", [])]))
PY

echo "total: $(( $(date +%s) - t_all )) s; jax $(python -c 'import jax; print(jax.__version__)'); $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$SUMMARY"
exit $status
