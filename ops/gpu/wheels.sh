#!/usr/bin/env bash
# Here, before a GPU session's device call (ops/gpu/README.md): the folder that travels beside
# the working tree, git-ignored (.gitignore), named in the call's `carry`.
#
#   bash ops/gpu/wheels.sh [--carry .gpu-carry]        # PYTHON picks the interpreter (default python3)
#
# Writes
#   .gpu-carry/wheels/    the cp312 manylinux x86_64 wheels of ops/gpu/wheels.txt (what the GPU
#                         image lacks), downloaded with --no-deps, exactly those versions
#   .gpu-carry/smollm2/   the embedded model's config and tokenizer (ops.gpu.models --export-spec;
#                         the machine builds a random-weight model of that config from it)
# and prints what travels against the device tool's 64 MiB: the working tree (tracked files and
# untracked ones git does not ignore) plus the carried folder. Exit 1 when it is over, when a
# package has two wheels, or when the folder is not ignored.
set -euo pipefail

CARRY=.gpu-carry
LIMIT_MIB=64
while (($#)); do
  case $1 in
    --carry) CARRY=${2:?--carry needs a directory}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
cd "$REPO"
mkdir -p "$CARRY"
if ! git check-ignore -q "$CARRY"; then
  echo "wheels.sh: $CARRY is not git-ignored: it would travel twice (as the tree and as carry); add it to .gitignore" >&2
  exit 1
fi

# pip matches manylinux_2_N exactly: name every N a wheel of the list is built for (llguidance: 2_31).
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

rm -rf "$CARRY/wheels" "$CARRY/smollm2"
mkdir -p "$CARRY/wheels"
echo "wheels.sh: downloading ops/gpu/wheels.txt for CPython 3.12, manylinux x86_64, into $CARRY/wheels"
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" -d "$CARRY/wheels" -r ops/gpu/wheels.txt

# One version of each: two wheels of one package stop the whole install there.
dupes=$(for w in "$CARRY"/wheels/*.whl; do basename "$w" | cut -d- -f1 | tr 'A-Z-' 'a-z_'; done | sort | uniq -d)
if [[ -n $dupes ]]; then
  echo "wheels.sh: two wheels of: $dupes" >&2
  exit 1
fi

"$PYTHON" -m ops.gpu.models --export-spec "$CARRY/smollm2"

mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
wheels=$(du -sb "$CARRY/wheels" | cut -f1)
spec=$(du -sb "$CARRY/smollm2" | cut -f1)
total=$((tree + wheels + spec))
echo "wheels.sh: $(ls "$CARRY"/wheels/*.whl | wc -l) wheels:"
for w in "$CARRY"/wheels/*.whl; do printf '  %-80s %s\n' "$(basename "$w")" "$(mib "$(stat -c %s "$w")")"; done
echo "wheels.sh: wheels $(mib "$wheels") + model spec $(mib "$spec") + working tree $(mib "$tree") = $(mib "$total") of ${LIMIT_MIB} MiB"
if ((total > LIMIT_MIB * 1048576)); then
  echo "wheels.sh: over the device tool's ${LIMIT_MIB} MiB: carry less" >&2
  exit 1
fi
echo "wheels.sh: ready: carry [\"$CARRY\"] in the device call (ops/gpu/README.md)"
