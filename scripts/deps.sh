#!/bin/sh
# Installs the Debian 12 packages planc needs, when some are missing (as root: apt-get; otherwise
# it names the command to run). Sourced by scripts/example.sh and scripts/test.sh.
PLANC_PACKAGES="cmake make gcc flex bison libfl-dev llvm-14-dev openmpi-bin libopenmpi-dev \
libopenblas-dev libjansson-dev libcmocka-dev clang-14 libclang-rt-14-dev python3 python3-torch time"
missing=""
for p in $PLANC_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	if [ "$(id -u)" -eq 0 ]; then
		echo "planc: installing$missing"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq && apt-get install -y -qq $missing >/dev/null || {
			echo "planc: apt-get install failed for:$missing" >&2
			exit 1
		}
	else
		echo "planc: missing Debian packages:$missing" >&2
		echo "planc: run: sudo apt-get install -y$missing" >&2
		exit 1
	fi
fi
