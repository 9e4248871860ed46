#!/usr/bin/env bash
# The GPU check (ops/gpu/README.md): one prepared command for a bare GPU machine, and its CPU
# dry run, which CI runs (tests/e2e/test_gpu_check_dry_run.py) so the script cannot rot.
#
#   bash ops/gpu/check.sh --out "$OUT"              # on the GPU machine, the carried folder beside it
#   bash ops/gpu/check.sh --dry-run --out DIR       # anywhere: --device cpu, tiny sizes, about 90 s
#
# Options: --carry DIR (default .gpu-carry: wheels/ and smollm2/, made by ops/gpu/wheels.sh),
# --budget SECONDS (default 480; the dry run 600), --only STAGES (comma separated: run only
# these of tests, bandwidth, step-ab, sweep, spec; install, preflight, models and the report run as
# needed), --keep-work (leave the stage outputs and the models in the work directory, which is
# otherwise removed). PYTHON picks the interpreter (default python3).
#
# Stages, in order, each under `timeout`: its own cap, or what is left of the budget less the
# report's reserve, whichever is less. A stage that fails is recorded and the next one runs;
# install and preflight failing end the check (nothing after them could run).
#   install    the carried wheels, --no-index, into a target directory put on PYTHONPATH
#   preflight  versions, imports and the device, in seconds, one line per problem
#   tests      tests/engine with SWITCHYARD_TEST_DEVICE=cuda: the GPU-only tests, the runner's
#              model paths, the engine on the tiny models (not the HTTP and Ray tiers, nor the
#              CPU-only modules: --quantization's kernels, --compile's one-row graph)
#   models     random-weight models built here: the embedded model's config, Llama-3.2-1B's shape
#   bandwidth  the card's copy bandwidth, the bound the 1B model's decode step is held to
#   step-ab    ops.bench.step_ab, CUDA graphs (native) against eager (native+nographs), per model
#   sweep-*    ops.bench.run with --device cuda, one server each: graphs (with the bare CUDA-graph
#              step, ops.bench.bare_native, as the baseline), --no-async-scheduling, --no-cuda-graphs
#   sweep-spec ops.bench.run with --device cuda, drafting off, --spec-decoding ngram and auto, one
#              server each (random weights repeat their own output: drafts are mostly accepted)
#   report     OUT/gpu-check.json and OUT/summary.md (printed); OUT/server-logs.tar.gz
# The whole output is also in OUT/gpu-check.log. Exit 0 when every stage passed, 1 when one did
# not, 2 for a usage error.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

DRY_RUN=0
OUT_DIR=""
CARRY=.gpu-carry
BUDGET=""
ONLY=""
KEEP_WORK=0
while (($#)); do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --out) OUT_DIR=${2:?--out needs a directory}; shift ;;
    --carry) CARRY=${2:?--carry needs a directory}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --only) ONLY=${2:?--only needs stage names}; shift ;;
    --keep-work) KEEP_WORK=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "check.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $OUT_DIR ]] || { echo "check.sh: --out DIR is needed (on the device machine: --out \"\$OUT\")" >&2; exit 2; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
[[ $CARRY = /* ]] || CARRY=$REPO/$CARRY
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
RESERVE=40    # seconds kept back for the report, and for a stage's grace after its TERM
GRACE=20      # a stage still running this long after its TERM is killed

if ((DRY_RUN)); then
  BUDGET=${BUDGET:-600}   # generous: about 90 s idle, and a loaded CI machine is 2-3x slower
  DEVICE=cpu
  BATCHES=1,2
  STEPS=6
  TESTS=(tests/engine/test_native_cuda_graphs.py -k "buckets_cover or capture_all or on_a_gpu")  # passes and GPU-only skips
  MODELS_ARGS=(--tiny)
  SERVER_ARGS="--device cpu --no-embeddings --no-compile --drain-timeout 5 --dtype float32 --num-threads 1 --kv-cache-gib 0.02"
  SWEEP_SIZE=(--requests-per-slot 1 --min-requests 2 --warmup 1 --bare-steps 8 --bare-threads 1 --time-cap 20 --request-timeout 30 --startup-timeout 90 --bare-timeout 90)
  BW_ARGS=(--mib 16 --reps 4)
  # No serial stage: it is the eager stage's script path with other flags, and a server is
  # ~10 s of CI's budget.
  SERIAL_VARIANTS=''
  SPEC_VARIANTS='ngram=--spec-decoding ngram'  # the stage's path, one server; off and auto on a GPU
  EAGER_VARIANTS='split2=--api-servers 2'  # the stage's path, one server (two front ends run the engine process's path too)
else
  BUDGET=${BUDGET:-480}
  DEVICE=cuda
  BATCHES=1,8,32,64,128
  SERIAL_VARIANTS='serial=--no-async-scheduling;interval4=--stream-interval 4'
  SPEC_VARIANTS='off=--spec-decoding off;ngram=--spec-decoding ngram;auto=--spec-decoding auto'
  EAGER_VARIANTS='nographs=--no-cuda-graphs;split=--engine-process;split2=--api-servers 2'
  STEPS=16
  # tests/engine but the modules of CPU-only code, which pin the CPU anyway (CI runs them).
  TESTS=(tests/engine --ignore=tests/engine/test_native_quant.py --ignore=tests/engine/test_native_compiled.py --ignore=tests/engine/test_native_decode_graph.py)
  MODELS_ARGS=(--spec "$CARRY/smollm2")
  SERVER_ARGS="--device cuda --no-embeddings --drain-timeout 5 --kv-cache-gib 4"
  SWEEP_SIZE=(--requests-per-slot 2 --min-requests 8 --warmup 2 --time-cap 15 --request-timeout 45 --startup-timeout 90 --bare-timeout 75)
  BW_ARGS=(--mib 1024 --reps 20)
fi
DEADLINE=$((SECONDS + BUDGET))

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
export SWITCHYARD_MODEL_STORE=$WORK/store   # nothing converts into the user's store
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$WORK/stages.tsv"; }

wanted() { [[ -z $ONLY || ,$ONLY, == *,$1,* ]]; }

# stage NAME CAP COMMAND...: COMMAND under `timeout`, for CAP seconds or what the budget has
# left, whichever is less; its status goes to the stage log. Returns COMMAND's exit status.
stage() {
  local name=$1 cap=$2 left limit started rc=0 status note=""
  shift 2
  left=$((DEADLINE - SECONDS - RESERVE))
  if ((left < 10)); then
    record "$name" out-of-time - 0 "not run: the budget is ${BUDGET}s"
    echo "=== [$name] not run: out of time"
    return 1
  fi
  limit=$((cap < left ? cap : left))
  echo "=== [$name] (at most ${limit}s) $*"
  started=$SECONDS
  timeout -s TERM -k "$GRACE" "$limit" "$@" || rc=$?
  status=ok
  if ((rc == 124 || rc == 137)); then
    status=timeout note="stopped at its ${limit}s limit"
  elif ((rc != 0)); then
    status=failed note="exit status $rc"
  fi
  record "$name" "$status" "$rc" $((SECONDS - started)) "$note"
  echo "=== [$name] $status in $((SECONDS - started))s${note:+: $note}"
  return "$rc"
}

skip() { record "$1" skipped - 0 "$2"; echo "=== [$1] skipped: $2"; }

install_wheels() {
  if ((DRY_RUN)); then
    skip install "dry run: the local environment has every package"
    return 0
  fi
  local site=$WORK/site
  if ! compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
    echo "check.sh: FAILED: no wheels in $CARRY/wheels: run ops/gpu/wheels.sh before the device call and carry ${CARRY#"$REPO"/}"
    record install failed 1 0 "no wheels in $CARRY/wheels"
    return 1
  fi
  stage install 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target "$site" "$CARRY"/wheels/*.whl || return 1
  export PYTHONPATH="$site:$PYTHONPATH"
}

# The report runs whatever the budget has left (the reserve is for it), and the server logs go
# back in one archive.
report() {
  local args=(--work "$WORK" --out "$OUT_DIR") rc=0
  if ((DRY_RUN)); then args+=(--dry-run); fi
  echo "=== [report] $PYTHON -m ops.gpu.report ${args[*]}"
  timeout -s TERM -k 10 60 "$PYTHON" -m ops.gpu.report "${args[@]}" || rc=$?
  if [[ -d $WORK/logs ]]; then
    tar -czf "$OUT_DIR/server-logs.tar.gz" -C "$WORK" logs || true
  fi
  case $rc in
    0) ;;
    3) echo "gpu-check: the report lists problems (above, and under \"problems\" in gpu-check.json)" ;;
    *) echo "gpu-check: FAILED: the report itself (exit status $rc): --keep-work keeps the stage outputs" ;;
  esac
  return "$rc"
}

run_stages() {
  local models_ok=0
  if wanted tests; then
    SWITCHYARD_TEST_DEVICE=$DEVICE stage tests 150 "$PYTHON" -m pytest "${TESTS[@]}" -q -rfEs -p no:cacheprovider \
      -o faulthandler_timeout=60 --junitxml="$WORK/tests.xml" || true
  fi
  if wanted step-ab || wanted sweep || wanted spec; then
    stage models 90 "$PYTHON" -m ops.gpu.models "${MODELS_ARGS[@]}" --dir "$WORK/models" --device "$DEVICE" --out "$WORK/models.json" && models_ok=1
  fi
  if wanted bandwidth; then
    stage bandwidth 45 "$PYTHON" -m ops.gpu.bandwidth --device "$DEVICE" "${BW_ARGS[@]}" --out "$WORK/bandwidth.json" || true
  fi
  for model in embedded llama-1b; do
    if ! wanted step-ab; then continue; fi
    if ((!models_ok)); then skip "step-ab-$model" "no models"; continue; fi
    stage "step-ab-$model" 90 "$PYTHON" -m ops.bench.step_ab --model "$WORK/models/$model" --variants native,native+nographs \
      --batches "$BATCHES" --steps "$STEPS" --device "$DEVICE" --out "$WORK/step_ab-$model.json" || true
  done
  if wanted sweep; then
    sweep "$models_ok"
  fi
  if wanted spec; then
    spec_sweep "$models_ok"
  fi
}

# ops.bench.run on the embedded shape at every level, as each sweep stage runs it.
SWEEP_RUN=("$PYTHON" -m ops.bench.run --model "$WORK/models/embedded" --levels "$BATCHES" --skip-bare --server-args "$SERVER_ARGS" "${SWEEP_SIZE[@]}")

# The server sweep, one ops.bench.run per server so a stage cut short loses one server, not all:
# graphs (the default on CUDA) with the bare CUDA-graph step as the baseline, then
# --no-async-scheduling (the serial step; async is the default) and --stream-interval 4 in one
# stage, then --no-cuda-graphs and --engine-process. ops.gpu.report puts them back together.
sweep() {
  if (($1 == 0)); then
    skip sweep-graphs "no models"
    return 0
  fi
  # The graphs server logs its steps (--log-level debug: a line a step), for the report's step table.
  stage sweep-graphs 150 "${SWEEP_RUN[@]}" --server-args "$SERVER_ARGS --log-level debug" --bare-native native --bare-native-baseline native --bare-batches "$BATCHES" --out "$WORK/sweep-graphs.json" || true
  # With --stream-interval 4 (fewer, larger chunks: the event loop's cost a chunk bounds the
  # server where steps are short, docs/performance.md "Where a step takes a few ms").
  if [[ -n $SERIAL_VARIANTS ]]; then
    stage sweep-serial 150 "${SWEEP_RUN[@]}" --skip-switchyard --switchyard-variants "$SERIAL_VARIANTS" --out "$WORK/sweep-serial.json" || true
  else
    skip sweep-serial "dry run: the eager stage runs the same script path"
  fi
  # Then --no-cuda-graphs, and the engine in its own process with one and two front ends
  # (--engine-process, --api-servers 2: issue 40's target is their c=64 and c=128 over the bare
  # CUDA-graph step of the graphs stage).
  stage sweep-eager 200 "${SWEEP_RUN[@]}" --skip-switchyard --switchyard-variants "$EAGER_VARIANTS" --out "$WORK/sweep-eager.json" || true
}

# Speculative decoding on the GPU: drafting off, n-gram and auto, one server each, in one stage
# (its own off server, so the three ratios come from one stage). The random-weight model's
# output repeats itself (99% of n-gram drafts accepted on an H200,
# ops/results/gpu-check-spec-stage-2026-11-27-h200.json): drafting's best case, at the GPU's
# step costs, and whether `auto` drafts where it pays.
spec_sweep() {
  if (($1 == 0)); then
    skip sweep-spec "no models"
    return 0
  fi
  stage sweep-spec 130 "${SWEEP_RUN[@]}" --skip-switchyard --switchyard-variants "$SPEC_VARIANTS" --out "$WORK/sweep-spec.json" || true
}

main() {
  echo "gpu-check: $( ((DRY_RUN)) && echo "DRY RUN, device cpu, tiny sizes" || echo "device cuda") | budget ${BUDGET}s | out $OUT_DIR | work $WORK"
  echo "gpu-check: $(git -C "$REPO" log -1 --format='%h %s' 2>/dev/null || echo 'no git'); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
  cd "$REPO"
  local ok=1
  if install_wheels && stage preflight 60 "$PYTHON" -m ops.gpu.preflight --device "$DEVICE" --out "$WORK/preflight.json"; then
    run_stages
  else
    ok=0
    echo "gpu-check: FAILED before the measurements: see the line above"
  fi
  report || ok=0
  if ((ok)) && ! cut -f2 "$WORK/stages.tsv" | grep -qv -e '^ok$' -e '^skipped$'; then
    echo "gpu-check: every stage passed in ${SECONDS}s"
    return 0
  fi
  echo "gpu-check: not every stage passed (${SECONDS}s): see the table above and $OUT_DIR/gpu-check.log"
  return 1
}

status=0
main 2>&1 | tee "$OUT_DIR/gpu-check.log" || status=$?
if ((KEEP_WORK)); then echo "gpu-check: the stage outputs stay in $WORK"; else rm -rf "$WORK"; fi
exit "$status"
