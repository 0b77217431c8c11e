#!/usr/bin/env bash
# kvtier's two commands:
#   ./run.sh demo   build and run the demo
#   ./run.sh test   build and run every suite this machine can run, the Python package's
#                   tests (pip-installed into build/venv), then the unit and integration
#                   suites again under ASan+UBSan, and the threaded tests under TSan
#   ./run.sh test-sglang   (opt-in) the SGLang backend under the real sglang and torch
#   ./run.sh test-vllm     (opt-in) the vLLM tier under the real vLLM 0.33.0 and torch
# Each installs the Debian packages it is missing (apt-get, only when missing), configures
# and builds on its own. Binaries land in build/tools/.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(gcc libc6-dev meson ninja-build pkg-config python3 python3-dev python3-venv libssl-dev
          liburing-dev liblmdb-dev libcmocka-dev libxxhash-dev fio gdb openssl
          redis-server)

install_missing() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "run.sh: installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# The CUDA toolkit is not a Debian package here; use it when it is installed.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"

build() {
    local dir=$1
    shift
    [ -f "$dir/build.ninja" ] || meson setup "$dir" "$@" >/dev/null
    ninja -C "$dir" >/dev/null
}

# The Python package: pip builds it (meson-python, from pyproject.toml; its build dir is
# kept, so a second run rebuilds only what changed) into build/venv, then its unittest suite.
PY_LOG=build/python-tests.log
python_tests() {
    rm -f "$PY_LOG"
    [ -x build/venv/bin/python ] || python3 -m venv build/venv
    # numpy: the vLLM tier's tests see the CPU pool through it, as vLLM does.
    build/venv/bin/pip install -q numpy || return 1
    build/venv/bin/pip install -q --config-settings=build-dir=build/pywheel . || return 1
    build/venv/bin/python -m unittest discover -s tests/python -v 2>&1 | tee "$PY_LOG"
    return "${PIPESTATUS[0]}"
}

# One plain closing line over every meson test run in this invocation, and the Python
# suite's unittest log (a missing or unfinished one counts as a failure).
summary() {
    python3 - "$@" <<'PY'
import json, re, sys
passed = failed = skipped = 0
unittest_log, logs = sys.argv[1], sys.argv[2:]
try:
    text = open(unittest_log).read()
except OSError:
    text = ""
ran = re.search(r"^Ran (\d+) tests?", text, re.M)
verdict = re.search(r"^(OK|FAILED)(?: \((.*)\))?$", text, re.M)
if not ran or not verdict:
    failed += 1
else:
    counts = {k: int(v) for k, v in
              (kv.split("=") for kv in (verdict.group(2) or "").split(", ") if kv)}
    bad = counts.get("failures", 0) + counts.get("errors", 0) + counts.get("unexpected successes", 0)
    skipped += counts.get("skipped", 0)
    failed += bad
    passed += int(ran.group(1)) - bad - counts.get("skipped", 0)
for log in logs:
    for line in open(log):
        if not line.strip():
            continue
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
}

cmd_demo() {
    install_missing
    build build
    # The disk tier's data dir outlives the run: a second ./run.sh demo reads from it.
    ./build/tools/kvtier-bench --host-tokens 262144 --disk-tokens 2000000 --dir build/demo-data
}

cmd_test() {
    install_missing
    local rc=0
    build build
    meson test -C build --print-errorlogs || rc=1
    python_tests || rc=1
    # Sanitizers: the sim backend only, so the CUDA runtime stays out of their way.
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
    ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-asan --suite unit --suite integration --print-errorlogs || rc=1
    # ThreadSanitizer over the tests that run transfer, disk I/O and stats server threads.
    build build-tsan -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled
    TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan --suite unit transfer hicache store store_contract store_redis disk_engine emb \
        pagestore stats_server --print-errorlogs || rc=1
    summary "$PY_LOG" build/meson-logs/testlog.json build-asan/meson-logs/testlog.json \
        build-tsan/meson-logs/testlog.json
    return $rc
}

# Opt-in, not part of test: the real SGLang (its wheel without its CUDA stack) and the torch it
# pins, about 6 GB, in build/venv-sglang; SGLang's own storage backend factory loads kvtier's
# backend and drives it over SGLang's real host pools, and SGLang's own cache controllers
# (HiCacheController, HybridCacheController) with their threads, on the CPU (tests/sglang).
SGLANG_PACKAGES=(torch==2.14.1 transformers==5.19.0 torchvision apache-tvm-ffi==0.1.11 numpy
                 orjson psutil pybase64 requests packaging pillow starlette typing_extensions
                 msgspec aiohttp pydantic pyzmq tqdm IPython xxhash zstandard dill
                 sentencepiece compressed-tensors gguf)
cmd_test_sglang() {
    install_missing
    local venv=build/venv-sglang
    [ -x $venv/bin/python ] || python3 -m venv $venv
    $venv/bin/pip install -q --no-deps "sglang==${SGLANG_VERSION:-0.5.23}"
    # pip warns that sglang's other pins (its CUDA kernels) are missing: they are not needed.
    $venv/bin/pip install -q "${SGLANG_PACKAGES[@]}"
    $venv/bin/pip install -q --config-settings=build-dir=build/pywheel-sglang .
    # From tests/sglang, so the checkout's python/ never shadows the installed package.
    (cd tests/sglang && ../../$venv/bin/python -W ignore -m unittest -v test_real_sglang \
        test_real_controller)
}

# Opt-in, not part of test: the real vLLM 0.33.0 (its wheel without its CUDA kernels' packages),
# the torch it pins and what its offloading modules import, about 4 GB, in build/venv-vllm;
# vLLM's own TieringOffloadingSpec builds kvtier's tier from the JSON a user passes and its
# tiering manager drives it (tests/vllm). No GPU: CUDA_VISIBLE_DEVICES is empty.
VLLM_PACKAGES=(torch==2.14.0 numpy packaging msgspec regex requests psutil pyzmq cbor2 aiohttp
               openai pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo prometheus_client
               partial_json_parser oss-harmony "transformers>=5.16.1,<5.21.0" xgrammar==0.2.8
               "llguidance>=1.7.0,<1.8.0" "fastapi>=0.133.0,<0.137.0")
cmd_test_vllm() {
    install_missing
    local venv=build/venv-vllm
    [ -x $venv/bin/python ] || python3 -m venv $venv
    $venv/bin/pip install -q --no-deps "vllm==${VLLM_VERSION:-0.33.0}"
    # pip warns that vllm's other pins (its CUDA stack) are missing: they are not needed.
    $venv/bin/pip install -q "${VLLM_PACKAGES[@]}"
    $venv/bin/pip install -q --config-settings=build-dir=build/pywheel-vllm .
    # From tests/vllm, so the checkout's python/ never shadows the installed package.
    (cd tests/vllm && CUDA_VISIBLE_DEVICES= ../../$venv/bin/python -W ignore -m unittest -v \
        test_real_vllm)
}

case "${1:-}" in
demo) cmd_demo ;;
test) cmd_test ;;
test-sglang) cmd_test_sglang ;;
test-vllm) cmd_test_vllm ;;
*)
    echo "usage: $0 demo|test|test-sglang|test-vllm" >&2
    exit 2
    ;;
esac
