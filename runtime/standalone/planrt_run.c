/* planrt_run.c: planrt-run, the launcher of programs built with planrt's node-local MPI (mpi.h and
 * mpi_local.c beside it), for machines without an MPI installation (the GPU check machine):
 *
 *   planrt-run -n N PROGRAM [ARGS...]
 *
 * It creates the shared memory the ranks exchange messages through (a memfd: a header and a ring
 * per ordered pair of ranks, sized so the whole stays under 1 GiB of address space; pages are
 * touched only as they are used), starts N copies of PROGRAM with PLANRT_RUN_FD, PLANRT_RUN_RANK,
 * PLANRT_RUN_SIZE and the node-local rank (PLANRT_LOCAL_RANK, PLANRT_LOCAL_SIZE, which planrt's GPU
 * binding reads like OMPI_COMM_WORLD_LOCAL_RANK), and waits for them, as mpirun does: SIGINT,
 * SIGTERM and SIGHUP are passed on to every rank; when a rank fails (a non-zero status or a
 * signal) the launcher says which, stops the others (SIGTERM, then SIGKILL after 10 s) and exits
 * with that rank's status (128 + the signal for a signal). A rank whose launcher dies gets SIGTERM
 * (PR_SET_PDEATHSIG). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_RANKS = 1024, SEG_MAGIC = 0x706c6d70, SEG_HEADER = 64, RING_HEADER = 128 };

static pid_t pids[MAX_RANKS];
static int nranks;
static volatile sig_atomic_t forward_sig, stop_hard;

static void on_signal(int sig)
{
	forward_sig = sig;
}

static void on_alarm(int sig)
{
	(void)sig;
	stop_hard = 1;
}

static void signal_all(int sig)
{
	for (int r = 0; r < nranks; r++)
		if (pids[r] > 0)
			kill(pids[r], sig);
}

static void usage(void)
{
	fprintf(stderr, "usage: planrt-run -n N PROGRAM [ARGS...]\n"
			"  starts N ranks of PROGRAM (built with planrt's node-local MPI, runtime/standalone) on this node\n");
	exit(2);
}

/* the shared segment: a header (magic, ranks, ring bytes) and n * n rings */
static int make_segment(int n, uint64_t *ring_bytes)
{
	uint64_t ring = (1ull << 30) / ((uint64_t)n * (uint64_t)n);
	ring = ring > (1u << 20) ? (1u << 20) : ring < (1u << 16) ? (1u << 16) : ring;
	ring &= ~(uint64_t)63;
	int fd = memfd_create("planrt-run", 0);
	if (fd < 0) {
		perror("planrt-run: memfd_create");
		exit(1);
	}
	uint64_t bytes = SEG_HEADER + (uint64_t)n * (uint64_t)n * (RING_HEADER + ring);
	struct {
		uint32_t magic, nranks;
		uint64_t ring_bytes;
	} h = {SEG_MAGIC, (uint32_t)n, ring};
	if (ftruncate(fd, (off_t)bytes) != 0 || pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
		fprintf(stderr, "planrt-run: cannot size %llu bytes of shared memory: %s\n", (unsigned long long)bytes,
			strerror(errno));
		exit(1);
	}
	*ring_bytes = ring;
	return fd;
}

static void start_rank(int r, int n, int fd, char **argv)
{
	pid_t pid = fork();
	if (pid < 0) {
		perror("planrt-run: fork");
		signal_all(SIGTERM);
		exit(1);
	}
	if (pid > 0) {
		pids[r] = pid;
		return;
	}
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	char text[32];
	snprintf(text, sizeof text, "%d", fd);
	setenv("PLANRT_RUN_FD", text, 1);
	snprintf(text, sizeof text, "%d", r);
	setenv("PLANRT_RUN_RANK", text, 1);
	setenv("PLANRT_LOCAL_RANK", text, 1);
	snprintf(text, sizeof text, "%d", n);
	setenv("PLANRT_RUN_SIZE", text, 1);
	setenv("PLANRT_LOCAL_SIZE", text, 1);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execvp(argv[0], argv);
	fprintf(stderr, "planrt-run: cannot start %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

int main(int argc, char **argv)
{
	int i = 1;
	nranks = 0;
	while (i < argc && argv[i][0] == '-') {
		if ((!strcmp(argv[i], "-n") || !strcmp(argv[i], "-np")) && i + 1 < argc) {
			char *end;
			long v = strtol(argv[i + 1], &end, 10);
			if (*end || v < 1 || v > MAX_RANKS) {
				fprintf(stderr, "planrt-run: -n takes a number of ranks from 1 to %d, not '%s'\n", MAX_RANKS,
					argv[i + 1]);
				return 2;
			}
			nranks = (int)v;
			i += 2;
		} else if (!strcmp(argv[i], "--")) {
			i++;
			break;
		} else {
			usage();
		}
	}
	if (!nranks || i >= argc)
		usage();
	uint64_t ring;
	int fd = make_segment(nranks, &ring);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	for (int r = 0; r < nranks; r++)
		start_rank(r, nranks, fd, argv + i);
	int left = nranks, status_out = 0, failed = 0;
	while (left > 0) {
		if (forward_sig) {
			signal_all(forward_sig);
			forward_sig = 0;
		}
		if (stop_hard) {
			signal_all(SIGKILL);
			stop_hard = 0;
		}
		int status;
		pid_t pid = waitpid(-1, &status, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		int r = 0;
		while (r < nranks && pids[r] != pid)
			r++;
		if (r == nranks)
			continue;
		pids[r] = 0;
		left--;
		int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
		if (code && !failed) {
			failed = 1;
			status_out = code;
			if (WIFSIGNALED(status))
				fprintf(stderr, "planrt-run: rank %d (pid %d) was killed by signal %d (%s); stopping the other ranks\n",
					r, (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
			else
				fprintf(stderr, "planrt-run: rank %d (pid %d) exited with status %d; stopping the other ranks\n", r,
					(int)pid, code);
			signal_all(SIGTERM);
			alarm(10);
		}
	}
	close(fd);
	return status_out;
}
