"""harness.py: what the test runners share (tests/memory/check_memory.py, tests/offload/check_offload.py): the
environment that runs mpirun as root on an oversubscribed machine with one thread per rank, a
PASS/FAIL tally that prints each check and the closing 'N passed, M failed' line, and explain's
JSON for a plan."""
import json
import os
import subprocess
import sys

MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def mpi_env(**extra):
    """os.environ with MPI_ENV and extra"""
    return dict(os.environ, **MPI_ENV, **extra)


class Tally:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)
        self.passed, self.failed = self.passed + bool(ok), self.failed + (not ok)

    def finish(self):
        """prints the closing line and exits 1 when a check failed"""
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


def explain(planc, src, plan, env=None):
    out = subprocess.run([planc, "explain", src, "--plan", plan, "--json"], capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout)
