#!/bin/bash
# The GPU checks in one script, for a session lent a GPU by the device tool.
#
#   tests/gpu/device-check.sh bundle [BUILD]   here: copy BUILD's (default build) GPU tests,
#                                              tools, their shared libraries and the traces
#                                              into .gpu/ (ignore it in .git/info/exclude)
#   tests/gpu/device-check.sh run [quick]      there (run with carry [".gpu"]): the tests,
#                                              the same tests under compute-sanitizer, the
#                                              transfer figures, the demo and trace slices on
#                                              cuda; logs under $OUT, a summary printed last
#   tests/gpu/device-check.sh run traces       there: the transfer test, then 2,000 requests of
#                                              each trace with the trace README's tiers, on
#                                              cuda and on sim, side by side
#
# Built here, run there: the binaries carry no CUDA toolkit need beyond the driver, and the
# libraries they link (liblmdb, liburing, ...) travel beside them. On an H200 (2026-11-26) the
# pieces took about four minutes together (hicache 45 s, its memcheck 75 s, the demo 25 s, the
# conversation slice 50 s); "quick" leaves out the sanitizers and the trace slice. Each step
# has its own timeout; give the call a timeout_s that leaves time to rerun.
set -u
G=.gpu

bundle() {
    local b=${1:-build}
    mkdir -p $G/bin $G/lib $G/traces || exit 1
    cp $b/tests/gpu/test_gpu_transfer $b/tests/gpu/test_gpu_hicache $b/tools/kvtier-xfer-bench \
        $b/tools/kvtier-bench $G/bin/ || exit 1
    cp -L $b/src/libkvtier.so.0 $G/lib/ || exit 1
    ldd $G/bin/* | awk '/=> \// {print $3}' | sort -u |
        grep -v -e '/libc\.so' -e '/libm\.so' -e '/libpthread' -e '/libdl\.' -e '/librt\.' \
            -e '/ld-linux' -e 'libkvtier' | xargs -r cp -L -t $G/lib/ || exit 1
    cp ../shared/traces/*.jsonl $G/traces/ 2>/dev/null || echo "no ../shared/traces: trace slices will be skipped"
    du -sh $G
}

run() {
    local quick=${1:-} out=${OUT:-/tmp/gpu-out} t0=$(date +%s)
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$PWD/$G/lib:${LD_LIBRARY_PATH:-} PATH=$PATH:/usr/local/cuda/bin
    local B=$PWD/$G/bin S=$out/summary.txt L=$out/log.txt
    : >"$S"
    step() { # name timeout command...: its output to the log, its status to the summary
        local n=$1 t=$2
        shift 2
        echo "===== $n: $*" >>"$L"
        timeout -k 5 "$t" "$@" >>"$L" 2>&1
        echo "$n rc=$? at $(($(date +%s) - t0))s" | tee -a "$S"
    }
    xb() { # name args...: one kvtier-xfer-bench run, its figures to the summary
        local n=$1
        shift
        step "$n" 60 "$B/kvtier-xfer-bench" --backend cuda --geometry llama3-8b "$@"
        awk -v n="$n:" '/^===== /{on=($2==n)} on && /H2D|D2H|streams| us /' "$L" >>"$S"
    }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$S"
    step transfer 120 "$B/test_gpu_transfer"
    if [ "$quick" = traces ]; then
        traces "$B" "$PWD/$G/traces"
        grep -E "^===== |from cache|verified|PASSED|FAILED|  time  " "$L" | cut -c1-120 >>"$S"
        cat "$S"
        return
    fi
    step hicache 180 "$B/test_gpu_hicache"
    xb xfer-auto
    xb xfer-kernel --io kernel
    xb xfer-dma --io dma
    xb xfer-dma-hint --io dma --dma-hint overlap
    xb xfer-kernel-all --io kernel --kernel-blocks 4096
    xb xfer-sweep --compute-us 200,400,800,1600
    step demo 90 "$B/kvtier-bench" --backend cuda --host-tokens 262144 --disk-tokens 2000000 --dir /tmp/kvt-demo
    step demo-again 90 "$B/kvtier-bench" --backend cuda --host-tokens 262144 --disk-tokens 2000000 --dir /tmp/kvt-demo
    if [ "$quick" != quick ]; then
        local g=gpt-oss-120b,head_dim=4,swa_window=0 T=$PWD/$G/traces
        if [ -f "$T/mooncake_conversation.jsonl" ]; then
            step conversation-150 120 "$B/kvtier-bench" --backend cuda --trace "$T/mooncake_conversation.jsonl" \
                --requests 150 --device-tokens 262144 --host-tokens 2000000 --disk-tokens 4000000 \
                --dir /tmp/kvt-conv --geometry $g
        fi
        for tool in memcheck synccheck racecheck; do
            step "$tool-transfer" 120 compute-sanitizer --tool $tool --error-exitcode 9 "$B/test_gpu_transfer"
        done
        step memcheck-hicache 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_gpu_hicache"
    fi
    grep -E "from cache|verified|PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$L" >>"$S"
    cat "$S"
}

# 2,000 requests of each trace, tiny geometry, the trace README's tiers (device 610, host
# 3,050, disk 30,500 blocks of 512 tokens), on cuda then on sim: the same tokens per tier, 0
# mismatches, and each backend's seconds (sim took 45 - 48 s for each on the development
# machine; the four steps stay under 500 s).
traces() {
    local B=$1 T=$2 tr be t
    for tr in mooncake_conversation mooncake_synthetic; do
        [ -f "$T/$tr.jsonl" ] || continue
        for be in cuda sim; do
            t=100
            [ $be = cuda ] && t=150
            rm -rf "/tmp/kvt-$tr-$be"
            step "$tr-$be" $t "$B/kvtier-bench" --backend $be --trace "$T/$tr.jsonl" --requests 2000 \
                --device-tokens 312320 --host-tokens 1561600 --disk-tokens 15616000 \
                --dir "/tmp/kvt-$tr-$be"
        done
    done
}

case "${1:-}" in
bundle) bundle "${2:-}" ;;
run) run "${2:-}" ;;
*)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
