#!/usr/bin/env bash
# Builds the node with `--features cuda` on a machine without a GPU, so a
# developer (or CI) can tell that the CUDA build compiles and links. The
# CUDA compiler, headers and runtime library come from the Python package
# registry (about 1.2 GB, cuBLAS most of it) into target/cuda-toolkit; the build goes to
# target/cuda-build so
# the CPU build's binaries are left alone. Nothing is run on a GPU.
#
#   tests/scripts/cuda-build.sh            # kernels for sm_90 (H100/H200)
#   CUDA_COMPUTE_CAP=80 tests/scripts/cuda-build.sh   # A100
#
# On a machine with a GPU and a CUDA driver, the binary it prints can then
# run `ragtag run --device cuda` (and `ragtag-bench --only trainer`).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

toolkit="$root/target/cuda-toolkit"
venv="$toolkit/venv"
# CUDA 13's wheels install one toolkit tree (bin/nvcc, include, lib, nvvm).
# 13.4: the newest release the cudarc of Cargo.lock knows.
cuda_version=13.4.92
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nvidia.cu13' 2>/dev/null; then
    echo "== installing nvcc, the CUDA headers and libcudart $cuda_version from PyPI into $toolkit"
    python3 -m venv "$venv"
    # candle links cuBLAS, cuRAND and NVRTC too (cudarc's dynamic linking).
    "$venv/bin/pip" install --quiet \
        "nvidia-cuda-nvcc==$cuda_version" "nvidia-cuda-crt==$cuda_version" "nvidia-nvvm==$cuda_version" \
        "nvidia-cuda-runtime==$cuda_version" "nvidia-cuda-nvrtc==$cuda_version" "nvidia-cuda-cccl<13.5" \
        nvidia-cublas nvidia-curand
fi
home=$("$venv/bin/python" -c 'import nvidia.cu13, os; print(os.path.realpath(nvidia.cu13.__path__[0]))')
# Where a toolkit install keeps them: lib64, and unversioned names for the
# linker.
[ -e "$home/lib64" ] || ln -s lib "$home/lib64"
for lib in cudart cublas cublasLt curand nvrtc; do
    [ -e "$home/lib/lib$lib.so" ] || ln -s "$(cd "$home/lib" && ls "lib$lib.so."* | head -n1)" "$home/lib/lib$lib.so"
done
# The driver (libcuda) comes with a GPU's driver, not with the toolkit's
# wheels: link against a stub that defines every driver function cudarc
# binds (as the toolkit's lib64/stubs/libcuda.so does) and is named
# libcuda.so.1, so on a machine with a GPU the real driver is loaded.
stubs="$toolkit/stubs"
if [ ! -e "$stubs/libcuda.so" ]; then
    cargo fetch --locked --quiet
    cudarc=$(grep -A1 '^name = "cudarc"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
    crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"cudarc-$cudarc.crate" | head -n1)
    mkdir -p "$stubs"
    tar -xzf "$crate" -C "$stubs" "cudarc-$cudarc/src/driver/sys/mod.rs"
    python3 - "$stubs/cudarc-$cudarc/src/driver/sys/mod.rs" > "$stubs/libcuda.c" <<'PY'
import re, sys
names = sorted(set(re.findall(r'extern "C" \{\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?fn (cu\w+)\(', open(sys.argv[1]).read())))
assert names, "no driver functions found in cudarc's bindings"
# Every call answers CUDA_ERROR_NO_DEVICE (100), so a binary that meets
# the stub at run time finds no GPU.
print("\n".join(f"int {n}(void) {{ return 100; }}" for n in names))
PY
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" "$stubs/libcuda.c"
    ln -sf libcuda.so "$stubs/libcuda.so.1"
fi

export CUDA_HOME="$home" CUDA_PATH="$home" NVCC="$home/bin/nvcc"
export PATH="$home/bin:$PATH"
export LIBRARY_PATH="$home/lib64:$stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CARGO_TARGET_DIR="$root/target/cuda-build"
nvcc --version | tail -n 2

echo "== cargo build --features cuda (kernels for sm_$CUDA_COMPUTE_CAP)"
start=$(date +%s)
cargo build --locked -p ragtag-node --features cuda --bins
echo "== built in $(( $(date +%s) - start )) s: $CARGO_TARGET_DIR/debug/ragtag"
# The libraries it loads (here the stub stands in for a GPU's driver), and
# a short run: with no GPU it must fall back to the CPU and say why.
export LD_LIBRARY_PATH="$home/lib64:$stubs"
ldd "$CARGO_TARGET_DIR/debug/ragtag" | grep -E 'cuda|cublas|curand|nvrtc'
"$CARGO_TARGET_DIR/debug/ragtag" --version
state=$(mktemp -d)
"$CARGO_TARGET_DIR/debug/ragtag" run --state "$state" --max-rounds 2 2>&1 | grep -E 'GPU|device|stopped'
rm -rf "$state"
