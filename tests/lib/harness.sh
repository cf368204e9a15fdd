# harness.sh: the one helper of the shell test runners (tests/*/*.sh), each of which sources it as
# `. "$(dirname "$0")/../lib/harness.sh"`. The shell half of harness.py:
#   the MPI environment   mpirun as root with more ranks than cores, over shared memory, one thread
#                         per rank, a waiting rank yielding its core, the watchdog at 60 s
#                         (exported; the same as harness.py's MPI_ENV, which says why)
#   $tmp                  a temporary directory, removed when the runner exits
#   ok [NAME]             counts a pass (and prints 'PASS: NAME' when named)
#   bad WHAT              counts a failure and prints 'FAIL: WHAT'
#   expect NAME STATUS PATTERN -- COMMAND...
#                         runs COMMAND (its output in $tmp/out): a pass when it exits with STATUS
#                         and its output holds PATTERN (grep; '' for any), else FAIL and its output
#   expect_fail NAME PATTERN NP ARGS...
#                         runs $PROG ARGS under mpirun -np NP (60 s at most): a pass when it exits
#                         non-zero (not at the time limit) and its output holds PATTERN
#   finish LABEL          prints 'LABEL: N passed, M failed (S s CPU)' (the CPU time of the runner
#                         and what it ran: a figure, never a check) and exits 1 when a check failed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_pml=ob1 HWLOC_COMPONENTS=-pci,-linuxio # harness.py's MPI_ENV says why
export HWLOC_PLUGINS_BLACKLIST=hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
: "${PLANRT_WATCHDOG:=60}"
export PLANRT_WATCHDOG

pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/planc-test.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

ok() {
	pass=$((pass + 1))
	if [ $# -gt 0 ]; then echo "PASS: $*"; fi
}

bad() {
	fail=$((fail + 1))
	echo "FAIL: $*"
}

# the output of a failed check, indented, without mpirun's '[host:pid]' noise
show_output() {
	grep -v '^\[' "$tmp/out" | sed 's/^/    /' | head -8
}

expect() {
	_name=$1 _want=$2 _pattern=$3
	shift 4
	"$@" >"$tmp/out" 2>&1
	_got=$?
	if [ "$_got" -eq "$_want" ] && { [ -z "$_pattern" ] || grep -q -- "$_pattern" "$tmp/out"; }; then
		ok
	else
		bad "$_name (exit $_got, want $_want; pattern '$_pattern')"
		show_output
	fi
}

expect_fail() {
	_name=$1 _pattern=$2 _np=$3
	shift 3
	timeout 60 mpirun -np "$_np" "$PROG" "$@" >"$tmp/out" 2>&1
	_got=$?
	if [ $_got -ne 0 ] && [ $_got -ne 124 ] && grep -q -- "$_pattern" "$tmp/out"; then
		ok
	else
		bad "$_name (exit $_got; want a non-zero exit and '$_pattern')"
		show_output
	fi
}

finish() {
	times >"$tmp/times" # (in this shell: a subshell's times start at zero)
	_cpu=$(awk '{ for (i = 1; i <= NF; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } } END { printf "%.1f", s }' "$tmp/times")
	echo "$1: $pass passed, $fail failed ($_cpu s CPU)"
	[ "$fail" -eq 0 ] && exit 0
	exit 1
}
