#!/bin/bash
# gpu-build.sh: build CUDA programs from `planc emit cuda` sources on a machine that has the CUDA
# toolkit but none of the project's build dependencies (no MPI, no OpenBLAS, no CMake build of
# planc): the half of scripts/gpu-check.sh that needs no GPU, also run by the test suite.
#
#   scripts/gpu-build.sh RUNTIME_DIR LIB_DIR  PROG_DIR OUT [PROG_DIR OUT ...]
#
# (a PROG_DIR that is a .cu file is compiled as a program of its own, linked like the programs: the
# GEMM benchmark and the NCCL / MPI device backend unit test of scripts/gpu-check.sh)
#
# RUNTIME_DIR holds planrt's sources (runtime/ of the repository: a folder per concern, include/).
# planrt and planrt_cuda are compiled once into LIB_DIR (kept: a second call reuses them) with
# planrt's node-local MPI (runtime/standalone/mpi.h and mpi_local.c): a program runs alone as a
# world of one rank, or as N ranks on this node under LIB_DIR/planrt-run -n N (built here from
# runtime/standalone/planrt_run.c); runtime/standalone/cblas.h stands in for OpenBLAS (the host
# multiplies nothing on the GPU's training path). jansson is the one
# C library planrt needs besides CUDA: its header and static archive are found in JANSSON_DIR
# (include/ and lib/), or the system's. Each PROG_DIR (prog.c, kernels.cu, loops.h) becomes the
# program OUT: kernels.cu with nvcc for sm_80 and sm_90 (SASS) and compute_80 PTX, prog.c with the
# C compiler, linked with cuBLAS, NCCL and the static CUDA runtime, never libcuda.
#
# The toolkit: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc). cuBLAS and NCCL: the
# toolkit's include/ and lib64/, else the Python wheels' (nvidia.cublas, nvidia.nccl: how PyTorch
# ships them), else CUBLAS_DIR / NCCL_DIR (each with include/ and lib/). GPU_ARCHS overrides the
# -gencode list (e.g. "arch=compute_90,code=sm_90" for a quicker build of one target; "code=compute_90"
# embeds PTX only, which skips ptxas). GPU_BUILD_OPT overrides the host code's optimisation level
# (default -O2; the test suite's -O0 builds programs that only start, or train a few steps).
set -euo pipefail
if [ $# -lt 4 ] || [ $(( ($# - 2) % 2 )) != 0 ]; then
	echo "usage: $0 RUNTIME_DIR LIB_DIR PROG_DIR OUT [PROG_DIR OUT ...]" >&2
	exit 2
fi
RT=$(cd "$1" && pwd)
LIB=$2
shift 2
mkdir -p "$LIB"
LIB=$(cd "$LIB" && pwd)

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "gpu-build: no nvcc (set NVCC or put the CUDA toolkit's bin/ on PATH)" >&2; exit 1; }
CUDA_HOME=${CUDA_HOME:-$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)}
CC=${CC:-cc}
GENCODE=${GPU_ARCHS:-"arch=compute_80,code=[sm_80,sm_90,compute_80]"}

# a library's include/ and lib/ directories: the toolkit's, a Python wheel's, or DIR from the environment
wheel_dirs() { # the directories under Python's nvidia/ wheels that hold include/HEADER (PyTorch's CUDA libraries)
	command -v python3 >/dev/null || return 0
	local sp
	for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null); do
		[ -d "$sp/nvidia" ] && find "$sp/nvidia" -maxdepth 4 -path "*/include/$1" 2>/dev/null | sed "s|/include/$1\$||"
	done | sort -u
}
find_lib() { # find_lib NAME HEADER SONAME_GLOB ENV_DIR -> sets ${NAME}_INC and ${NAME}_LIB (a file)
	local name=$1 header=$2 glob=$3 envdir=$4 d inc= lib=
	for d in "$envdir" "$CUDA_HOME" "$CUDA_HOME/targets/x86_64-linux" /usr /usr/local $(wheel_dirs "$header"); do
		[ -n "$d" ] || continue
		if [ -f "$d/include/$header" ]; then
			for l in "$d"/lib64/$glob "$d"/lib/$glob "$d"/lib/x86_64-linux-gnu/$glob; do
				if [ -f "$l" ]; then inc=$d/include; lib=$l; break 2; fi
			done
		fi
	done
	if [ -z "$lib" ]; then
		echo "gpu-build: $name not found ($header and $glob in the toolkit, /usr, the nvidia.${name,,} wheel or \$${name}_DIR)" >&2
		exit 1
	fi
	printf -v "${name}_INC" %s "$inc"
	printf -v "${name}_LIB" %s "$lib"
	echo "gpu-build: $name: $lib"
}
find_lib CUBLAS cublas_v2.h "libcublas.so*" "${CUBLAS_DIR:-}"
find_lib NCCL nccl.h "libnccl.so*" "${NCCL_DIR:-}"
CUBLASLT_LIB=$(ls "$(dirname "$CUBLAS_LIB")"/libcublasLt.so* 2>/dev/null | head -1 || true)
CUDART_A=
for l in "$CUDA_HOME"/lib64/libcudart_static.a "$CUDA_HOME"/targets/x86_64-linux/lib/libcudart_static.a; do
	[ -f "$l" ] && { CUDART_A=$l; break; }
done
if [ -z "$CUDART_A" ]; then # the shared runtime then (still never libcuda)
	echo "gpu-build: no libcudart_static.a in $CUDA_HOME: linking the shared CUDA runtime" >&2
	CUDART_A="-L$CUDA_HOME/lib64 -L$CUDA_HOME/targets/x86_64-linux/lib -lcudart"
fi
JANSSON_INC=/usr/include JANSSON_A=/usr/lib/x86_64-linux-gnu/libjansson.a
if [ -n "${JANSSON_DIR:-}" ]; then JANSSON_INC=$JANSSON_DIR/include JANSSON_A=$JANSSON_DIR/lib/libjansson.a; fi
[ -f "$JANSSON_INC/jansson.h" ] && [ -f "$JANSSON_A" ] || {
	echo "gpu-build: jansson not found ($JANSSON_INC/jansson.h, $JANSSON_A): set JANSSON_DIR" >&2; exit 1; }

# standalone/ first: its mpi.h and cblas.h are the node-local MPI and the plain GEMM
# (never -isystem /usr/include: it reorders the system directories and breaks libstdc++'s #include_next)
INCS=(-I"$RT/standalone" -I"$RT/include")
for d in "$JANSSON_INC" "$CUDA_HOME/include" "$CUBLAS_INC" "$NCCL_INC"; do
	case "$d" in /usr/include | /usr/local/include) ;; *) INCS+=(-isystem "$d") ;; esac
done
OPT=${GPU_BUILD_OPT:--O2}
CFLAGS=(-std=gnu11 "$OPT" -fPIC -Wall -Wno-unused-parameter -Wno-unused-function "${INCS[@]}")
NVFLAGS=(-std=c++17 "$OPT" -gencode "$GENCODE" -Xcompiler=-fPIC,-Wall "${INCS[@]}")

# planrt + planrt_cuda, once (rebuilt when a source is newer than the archive), and planrt-run
ARCHIVE=$LIB/libplanrt_local.a
stale=0
[ -f "$ARCHIVE" ] || stale=1
for s in "$RT"/*/*.c "$RT"/*/*.cu "$RT"/*/*.h; do
	[ "$s" -nt "$ARCHIVE" ] && stale=1
done
if [ $stale = 1 ]; then
	t0=$(date +%s.%N)
	rm -f "$LIB"/*.o "$ARCHIVE"
	pids=()
	for s in "$RT"/*/*.c; do
		[ "$(basename "$s")" = planrt_run.c ] && continue # the launcher: a program of its own
		"$CC" "${CFLAGS[@]}" -c "$s" -o "$LIB/$(basename "$s" .c).c.o" & pids+=($!)
	done
	"$CC" -std=gnu11 -O2 -Wall "$RT/standalone/planrt_run.c" -o "$LIB/planrt-run" & pids+=($!)
	for s in "$RT"/*/*.cu; do
		"$NVCC" "${NVFLAGS[@]}" -c "$s" -o "$LIB/$(basename "$s" .cu).cu.o" & pids+=($!)
	done
	fail=0
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
	[ $fail = 0 ] || { echo "gpu-build: compiling planrt failed" >&2; exit 1; }
	ar rcs "$ARCHIVE" "$LIB"/*.o
	printf 'gpu-build: planrt (node-local MPI) + planrt_cuda + planrt-run: %.1f s\n' "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')"
fi

LINK=("$ARCHIVE" "$JANSSON_A" "$CUBLAS_LIB" ${CUBLASLT_LIB:+"$CUBLASLT_LIB"} "$NCCL_LIB" $CUDART_A
      -Wl,-rpath,"$(dirname "$CUBLAS_LIB")" -Wl,-rpath,"$(dirname "$NCCL_LIB")" -ldl -lrt -lpthread -lstdc++ -lm)
# one program: PROG_DIR (prog.c, kernels.cu) or a .cu file of its own (a benchmark, a unit test,
# which may reach planrt_cuda_internal.h)
build_one() {
	local src=$1 out=$2 t0 obj
	t0=$(date +%s.%N)
	obj=$(mktemp -d)
	if [ -f "$src" ] && [ "${src%.cu}" != "$src" ]; then
		"$NVCC" "${NVFLAGS[@]}" -I"$RT/cuda" -c "$src" -o "$obj/main.o" &&
			"$CC" "$obj/main.o" -o "$out" "${LINK[@]}" || { rm -rf "$obj"; return 1; }
	else
		"$NVCC" "${NVFLAGS[@]}" -I"$src" -c "$src/kernels.cu" -o "$obj/kernels.o" &&
			"$CC" "${CFLAGS[@]}" -O1 -I"$src" -c "$src/prog.c" -o "$obj/prog.o" &&
			"$CC" "$obj/prog.o" "$obj/kernels.o" -o "$out" "${LINK[@]}" || { rm -rf "$obj"; return 1; }
	fi
	rm -rf "$obj"
	printf 'gpu-build: %s: %.1f s\n' "$out" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')"
}
# the programs, GPU_BUILD_JOBS at a time (default: the cores)
JOBS=${GPU_BUILD_JOBS:-$(nproc 2>/dev/null || echo 4)}
pids=()
fail=0
while [ $# -gt 0 ]; do
	build_one "$1" "$2" & pids+=($!)
	shift 2
	if [ ${#pids[@]} -ge "$JOBS" ]; then
		wait "${pids[0]}" || fail=1
		pids=("${pids[@]:1}")
	fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ $fail = 0 ] || { echo "gpu-build: building a program failed" >&2; exit 1; }
