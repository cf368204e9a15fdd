/* run_files.c: the paths a run reads and writes, checked by rank 0 before any work: an input that
 * is not a regular file (a FIFO would block; --map must be a file), an output that is an input or
 * another output (the same file, by inode or by path), an output that planrt_outfile's rule
 * refuses (a directory, FIFO, socket, block device or symbolic link) or whose directory does not
 * take a new file (probed: a file created and removed beside the target), so that an unusable
 * path fails in the first second, not after training. */
#include "driver.h"
#include "planrt_outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file the run will write must be usable before training: planrt_outfile's rule (absent or a
 * regular file, written beside and renamed; a character device written in place; a directory,
 * FIFO, socket, block device or symbolic link refused), and its directory must take a new file
 * (a probe created and removed beside the target). */
static void check_output(const char *what, const char *path)
{
	char why[1024];
	if (planrt_outfile_check(what, path, why, sizeof why) != 0)
		planrt_fatal("%s", why);
	struct stat st;
	if (lstat(path, &st) == 0 && S_ISCHR(st.st_mode))
		return; /* written in place */
	char *copy = strdup(path);
	if (!copy)
		planrt_fatal("out of memory checking %s '%s'", what, path);
	const char *dir = dirname(copy);
	if (stat(dir, &st) != 0)
		planrt_fatal("cannot write %s '%s': directory '%s': %s; create it first", what, path, dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		planrt_fatal("cannot write %s '%s': '%s' is not a directory", what, path, dir);
	size_t n = strlen(path) + 48;
	char *probe = malloc(n);
	if (!probe)
		planrt_fatal("out of memory checking %s '%s'", what, path);
	int fd = -1;
	for (int k = 0; k < 100 && fd < 0; k++) {
		snprintf(probe, n, "%s.tmp.probe.%ld.%d", path, (long)getpid(), k);
		fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0)
		planrt_fatal("cannot write %s '%s': cannot create a file in '%s': %s; check its permissions and free space",
			     what, path, dir, strerror(errno));
	close(fd);
	unlink(probe);
	free(probe);
	free(copy);
}

typedef struct run_file {
	const char *what, *path;
	int output;
	int exists;
	struct stat st;
	char canon[4096]; /* the directory's real path and the name: equal for two paths of one file */
} run_file_t;

static void canonical(run_file_t *f)
{
	char *a = strdup(f->path), *b = strdup(f->path), real[PATH_MAX];
	if (!a || !b)
		planrt_fatal("out of memory");
	int n = realpath(dirname(a), real) ? snprintf(f->canon, sizeof f->canon, "%.2048s/%.1024s", real, basename(b))
					   : snprintf(f->canon, sizeof f->canon, "%.3000s", f->path);
	(void)n;
	free(a);
	free(b);
}

/* Before any work (rank 0): an input that is not a regular file (a FIFO would block), an output
 * that is an input or another output (the same file, by inode or by path), each an error; then
 * every output is probed. Nothing has been written yet. */
void planrt_check_run_files_(const options_t *o)
{
	const char *what[] = {"--data", "--init", "--map", "--resume", "the program", "--save", "--log", "--trace", "--save-every"};
	const char *path[] = {o->data, o->init, o->map, o->resume, "/proc/self/exe", o->save, o->log, o->trace, o->save_every_dir};
	enum { N = sizeof what / sizeof what[0], FIRST_OUTPUT = 5, FILE_INPUTS = 3 };
	run_file_t f[N];
	memset(f, 0, sizeof f);
	int n = N;
	for (int i = 0; i < n; i++) {
		f[i].what = what[i];
		f[i].path = path[i];
		f[i].output = i >= FIRST_OUTPUT;
	}
	for (int i = 0; i < n; i++) {
		if (!f[i].path)
			continue;
		f[i].exists = stat(f[i].path, &f[i].st) == 0;
		canonical(&f[i]);
		if (f[i].exists && !f[i].output && i < FILE_INPUTS && !S_ISREG(f[i].st.st_mode) &&
		    (!S_ISDIR(f[i].st.st_mode) || !strcmp(f[i].what, "--map")))
			planrt_fatal("%s '%s' is %s; pass a file", f[i].what, f[i].path,
				     S_ISDIR(f[i].st.st_mode) ? "a directory, not a name map file"
							      : "not a regular file (a FIFO, socket or device, which would block or never end)");
	}
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			if (!f[i].path || !f[j].path || (!f[i].output && !f[j].output))
				continue;
			if (!strcmp(f[i].what, "--resume") && !strcmp(f[j].what, "--save-every"))
				continue; /* resuming from the directory the run keeps saving to */
			if (f[i].output && f[j].exists && S_ISCHR(f[j].st.st_mode))
				continue; /* two outputs to one device (/dev/null): each writes in place */
			int same = f[i].exists && f[j].exists ? f[i].st.st_dev == f[j].st.st_dev && f[i].st.st_ino == f[j].st.st_ino
							     : !strcmp(f[i].canon, f[j].canon);
			if (same)
				planrt_fatal("%s '%s' and %s '%s' are the same file: writing %s would destroy %s; pass another path",
					     f[i].what, f[i].path, f[j].what, f[j].path, f[j].what,
					     f[i].output ? "the other output" : "the input");
		}
	if (o->save)
		check_output("--save", o->save);
	if (o->trace)
		check_output("--trace", o->trace);
	if (o->log)
		check_output("--log", o->log);
	if (o->save_every_dir) {
		struct stat st;
		if (stat(o->save_every_dir, &st) == 0 && !S_ISDIR(st.st_mode))
			planrt_fatal("--save-every '%s' is not a directory; pass a directory for the checkpoints", o->save_every_dir);
		if (stat(o->save_every_dir, &st) != 0 && mkdir(o->save_every_dir, 0777) != 0)
			planrt_fatal("cannot create the --save-every directory '%s': %s; create its parent first",
				     o->save_every_dir, strerror(errno));
		size_t len = strlen(o->save_every_dir) + 16;
		char *probe = malloc(len);
		if (!probe)
			planrt_fatal("out of memory");
		snprintf(probe, len, "%s/probe", o->save_every_dir);
		check_output("--save-every", probe);
		free(probe);
	}
}
