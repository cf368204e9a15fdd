/* tempfile.c: the temporary files planrt writes beside a target before renaming them over it
 * (PATH.tmp.PID, PATH.tmp.probe.PID.K). The one this rank is writing is remembered, so that a
 * signal that ends the process removes it (the monitor thread calls planrt_remove_pending_tmp_);
 * at start, rank 0 removes those beside --save whose process no longer lives (a killed save). */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_tempfile.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the temporary file this rank is writing, removed if a signal ends the process */
static char pending_tmp[4096];

void planrt_pending_tmp_(const char *path)
{
	snprintf(pending_tmp, sizeof pending_tmp, "%s", path ? path : "");
}

void planrt_remove_pending_tmp_(void)
{
	if (pending_tmp[0])
		unlink(pending_tmp);
}

/* whether pid is a live process of this host (a zombie, a killed process nobody reaped, is not) */
static int pid_alive(long pid)
{
	if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *state = strrchr(buf, ')'); /* "pid (comm) S ..." */
	return !(state && state[1] == ' ' && state[2] == 'Z');
}

/* A temporary file planrt names PATH.tmp.PID (or .tmp.probe.PID.K) is stale when no process of
 * this host has that pid: a save that was killed. Rank 0 removes them beside --save at start. */
void planrt_remove_stale_temps_(const char *target)
{
	char *a = strdup(target), *b = strdup(target);
	if (!a || !b)
		planrt_fatal("out of memory");
	const char *dir = dirname(a), *base = basename(b);
	size_t bl = strlen(base);
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".tmp.", 5))
			continue;
		const char *t = e->d_name + bl + 5;
		if (!strncmp(t, "probe.", 6))
			t += 6;
		char *end;
		long pid = strtol(t, &end, 10);
		if (end == t || (*end && *end != '.') || pid_alive(pid))
			continue;
		size_t n = strlen(dir) + strlen(e->d_name) + 2;
		char *p = malloc(n);
		if (p) {
			snprintf(p, n, "%s/%s", dir, e->d_name);
			if (unlink(p) == 0)
				fprintf(stderr, "planrt: note: removed '%s', the temporary file of a save that did not finish\n", p);
			free(p);
		}
	}
	if (d)
		closedir(d);
	free(a);
	free(b);
}
