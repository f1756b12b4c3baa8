#!/bin/sh
# Mutation check of the hub's fault handling (issue 20): each patch beside
# this script breaks one behaviour on purpose, and at least one test must
# fail against the broken hub. A mutant no test notices means the tests do
# not guard that behaviour.
#
#   no_failover     a task whose replica died (or erred, or timed out) is
#                   computed on the hub instead of re-dispatched elsewhere
#   no_deadlines    the per-expert deadline (--timeout-ms) never fires: a
#                   hung worker is noticed by heartbeat silence only
#   evict_everyone  one wrong answer caught by --verify evicts every worker
#   evict_checked   every worker whose result --verify checks is evicted
#
# usage: tests/hub/mutants/run.sh [--full] [WORK_DIR]
#   WORK_DIR  default <repo>/build-mutants: a copy of the working tree (src/,
#             made afresh each run), its build (build/) and the tests'
#             scratch (work/; each run's logs in work/logs/<mutant>/)
#   --full    after the scenarios, also runs every ctest test labelled dist
#             (except slow) against each mutant, to list all that kill it
#   MOEX_MUTANTS="a b"  only those mutants (default: all four)
#
# The working tree is copied, never patched. The unmutated copy must pass
# every test first; then, per mutant: apply its patch, rebuild the binaries
# the tests run, run the tests, revert. Prints "killed by: ..." or SURVIVED
# per mutant; exits 1 when a mutant survived or the unmutated tree failed.
# Not part of ctest (it rebuilds the hub once per mutant): ~1 min on 2 cores,
# ~10 min with --full (which builds the whole tree once).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
full=0
if [ "${1:-}" = "--full" ]; then full=1; shift; fi
work=${1:-$root/build-mutants}
jobs=${MOEX_MUTANT_JOBS:-2}
python=${MOEX_PYTHON:-/usr/bin/python3}
src=$work/src
build=$work/build
scratch=$work/work
mkdir -p "$work" "$scratch"
work=$(cd "$work" && pwd)
src=$work/src build=$work/build scratch=$work/work

# The test_dist.py scenarios that should catch each mutant (each run alone,
# so a failure names its scenario).
scenarios() {
    case $1 in
    no_failover) echo worker_deaths all_but_one_gone hung_worker ;;
    no_deadlines) echo hung_worker ;;
    evict_everyone | evict_checked) echo corrupt_worker_evicted ;;
    *) echo "$all_scenarios" ;;
    esac
}
mutants=${MOEX_MUTANTS:-no_failover no_deadlines evict_everyone evict_checked}
all_scenarios="worker_deaths all_but_one_gone hung_worker corrupt_worker_evicted"

# A fresh copy of the working tree (tracked and untracked, not ignored), its
# own git repository so that `git apply` patches it and nothing else. Fresh
# mtimes: the build recompiles whatever differs from the last copy.
rm -rf "$src"
mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 sh -c \
    'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh | tar --null -T - -cf -) | tar -xmf - -C "$src"
git -C "$src" init -q

applied=
revert() {
    if [ -n "$applied" ]; then
        git -C "$src" apply -R "$here/$applied.patch" && touch $(git -C "$src" apply --numstat "$here/$applied.patch" |
            awk -v s="$src" '{print s "/" $3}')
        applied=
    fi
}
trap revert EXIT
trap 'exit 130' INT TERM

log=$work/build.log
build_bins() {
    if [ ! -f "$build/CMakeCache.txt" ]; then
        cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEX_VULKAN=OFF >"$log" 2>&1 ||
            { tail -30 "$log"; echo "run.sh: configuring failed ($log)"; exit 2; }
    fi
    targets="moex-hub moex-worker moex-gguf moex-relay"
    cmake --build "$build" -j"$jobs" --target $targets >>"$log" 2>&1 ||
        { tail -30 "$log"; echo "run.sh: building failed ($log)"; exit 2; }
}

# Runs the named scenarios one by one (logs in $logs); prints the failing ones.
failing_scenarios() {
    failed=
    for s in "$@"; do
        out=$logs/$s.log
        if ! MOEX_LOG=warn timeout 600 "$python" "$src/tests/hub/test_dist.py" "$build/bin" "$src/tests/data/vocab" \
            "$scratch" "$s" >"$out" 2>&1; then
            failed="$failed test_dist.py:$s"
        fi
    done
    echo "$failed"
}

# Every dist ctest test (not slow); prints the failing ones. Builds the rest of the tree first.
failing_ctests() {
    cmake --build "$build" -j"$jobs" >>"$log" 2>&1 || { echo " (build failed: $log)"; return; }
    ctest --test-dir "$build" -L dist -LE slow --output-on-failure >"$logs/ctest.log" 2>&1 || true
    sed -n 's/^[[:space:]]*[0-9]* - \([A-Za-z0-9_]*\) (.*/ ctest:\1/p' "$logs/ctest.log" | tr -d '\n'
}

echo "unmutated tree: building"
logs=$scratch/logs/unmutated
rm -rf "$scratch/logs" && mkdir -p "$logs"
build_bins
failed=$(failing_scenarios $all_scenarios)
[ "$full" = 1 ] && failed="$failed$(failing_ctests)"
if [ -n "$failed" ]; then
    echo "unmutated tree fails:$failed (logs in $logs); a kill would prove nothing"
    exit 1
fi
echo "unmutated tree: passes $all_scenarios$([ "$full" = 1 ] && echo ' and ctest -L dist')"

survivors=0
for m in $mutants; do
    git -C "$src" apply --check "$here/$m.patch" || { echo "$m: the patch no longer applies; update it"; exit 2; }
    git -C "$src" apply "$here/$m.patch"
    applied=$m
    logs=$scratch/logs/$m
    mkdir -p "$logs"
    build_bins
    killed=$(failing_scenarios $(scenarios "$m"))
    [ "$full" = 1 ] && killed="$killed$(failing_ctests)"
    revert
    if [ -n "$killed" ]; then
        echo "$m: killed by:$killed"
    else
        echo "$m: SURVIVED"
        survivors=$((survivors + 1))
    fi
done
[ "$survivors" = 0 ] && echo "every mutant killed" || echo "$survivors mutant(s) survived"
[ "$survivors" = 0 ]
