/* outfile.c: the one rule by which planc and planrt write an output file (planrt_outfile.h): a
 * temporary file beside an absent or regular target, fsynced and renamed over it; a character
 * device written in place; anything else refused before a byte is written. It also remembers the
 * temporary file being written, so that a signal removes it, and removes at start the temporary
 * files of writers that were killed (their pid no longer lives). Only the C library is used:
 * planc links this file too (through planrt) for its own outputs. */
#define PLANRT_INTERNAL
#include "planrt_outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t n, const char *fmt, ...)
{
	if (!why || !n)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
}

/* lstat's verdict on path: 1 absent or a regular file (write beside it and rename), 2 a character
 * device (write in place), 0 refused (why set), -1 cannot tell (why set) */
static int classify(const char *what, const char *path, char *why, size_t n)
{
	struct stat st;
	if (!*path) {
		say(why, n, "%s needs a path, not an empty value", what);
		return 0;
	}
	if (lstat(path, &st) != 0) {
		if (errno == ENOENT)
			return 1;
		say(why, n, "cannot write %s '%s': %s", what, path, strerror(errno));
		return -1;
	}
	if (S_ISREG(st.st_mode))
		return 1;
	if (S_ISCHR(st.st_mode))
		return 2;
	if (S_ISLNK(st.st_mode)) {
		char to[4096];
		ssize_t k = readlink(path, to, sizeof to - 1);
		to[k > 0 ? k : 0] = 0;
		say(why, n,
		    "%s '%s' is a symbolic link (to '%s'): writing it would replace the link, not write what it points to; "
		    "pass the target's path instead",
		    what, path, to);
		return 0;
	}
	const char *kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
			   : S_ISBLK(st.st_mode) ? "a block device" : "not a regular file";
	if (S_ISDIR(st.st_mode))
		say(why, n, "%s '%s' is a directory; pass a file name inside it, such as '%s/out'", what, path, path);
	else
		say(why, n,
		    "%s '%s' is %s, which is never written over; pass a regular file's path (or a character device such as "
		    "/dev/null, written in place)",
		    what, path, kind);
	return 0;
}

int planrt_outfile_check(const char *what, const char *path, char *why, size_t n)
{
	return classify(what, path, why, n) > 0 ? 0 : -1;
}

static void name_tmp(planrt_outfile_t *f, const char *path, long id)
{
	snprintf(f->path, sizeof f->path, "%s", path);
	snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, id);
	f->fd = -1;
	f->fp = NULL;
}

/* Set by planrt_outfile_stop (a stop signal's cleanup): from then on no output is begun or
 * committed. planrt's monitor thread removes the pending temporary file and then lets the
 * process live 0.5 s in a job of several ranks (runtime/comm/comm_mpi.c, SIGNAL_LINGER_S) while
 * the rank's other threads run on; a writer that reaches an open or a commit waits here for the
 * end instead of leaving a new temporary file or failing a rename of the one removed. */
static volatile sig_atomic_t stopping;
/* held while a temporary file is created and named pending, and while one is renamed and no
 * longer pending, so that planrt_outfile_stop removes a pending file before or after, never
 * between (a rename of a file it removed failed, a file created unnamed was left) */
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;

static void wait_if_stopping(void)
{
	while (stopping)
		pause(); /* this thread blocks the stop signals; the monitor ends the process */
}

/* pending_lock taken, unless the process is stopping: then this thread waits for its end */
static void lock_unless_stopping(void)
{
	pthread_mutex_lock(&pending_lock);
	if (stopping) {
		pthread_mutex_unlock(&pending_lock);
		wait_if_stopping();
	}
}

int planrt_outfile_open(planrt_outfile_t *f, const char *what, const char *path, long id, char *why, size_t n)
{
	wait_if_stopping();
	name_tmp(f, path, id);
	int kind = classify(what, path, why, n);
	if (kind <= 0)
		return -1;
	f->in_place = kind == 2;
	if (f->in_place) {
		snprintf(f->tmp, sizeof f->tmp, "%s", path);
		f->fd = open(path, O_WRONLY | O_CLOEXEC);
	} else {
		lock_unless_stopping();
		unlink(f->tmp); /* a leftover of an earlier process with this pid */
		f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (f->fd >= 0)
			planrt_outfile_pending(f->tmp);
		pthread_mutex_unlock(&pending_lock);
	}
	if (f->fd < 0) {
		int e = errno;
		say(why, n, "cannot write %s '%s' (create '%s': %s); check the directory's permissions and free space", what,
		    path, f->tmp, strerror(e));
		errno = e;
		return -1;
	}
	return 0;
}

int planrt_outfile_join(planrt_outfile_t *f, const char *path, long id, char *why, size_t n)
{
	wait_if_stopping();
	name_tmp(f, path, id);
	struct stat st;
	f->in_place = lstat(path, &st) == 0 && S_ISCHR(st.st_mode);
	if (f->in_place)
		snprintf(f->tmp, sizeof f->tmp, "%s", path);
	f->fd = open(f->tmp, O_WRONLY | O_CLOEXEC);
	if (f->fd < 0) {
		int e = errno;
		say(why, n, "cannot open '%s' for writing: %s", f->tmp, strerror(e));
		errno = e;
		return -1;
	}
	return 0;
}

FILE *planrt_outfile_stream(planrt_outfile_t *f, char *why, size_t n)
{
	if (!f->fp && f->fd >= 0 && !(f->fp = fdopen(f->fd, "w")))
		say(why, n, "cannot write '%s': %s", f->tmp, strerror(errno));
	return f->fp;
}

/* flush (a stream), fsync and close: 0 or the errno of the first step that failed, *step named */
static int finish(planrt_outfile_t *f, const char **step)
{
	int e = 0;
	if (f->fp) {
		*step = "write";
		if (fflush(f->fp) != 0 || ferror(f->fp))
			e = errno ? errno : EIO;
	}
	/* a device may not support fsync (EINVAL, EROFS); its data is the driver's */
	if (!e && f->fd >= 0 && fsync(f->fd) != 0 && !(f->in_place && (errno == EINVAL || errno == EROFS || errno == ENOTSUP))) {
		e = errno;
		*step = "fsync";
	}
	int c = f->fp ? fclose(f->fp) : f->fd >= 0 ? close(f->fd) : 0;
	if (c != 0 && !e) {
		e = errno;
		*step = "close";
	}
	f->fp = NULL;
	f->fd = -1;
	return e;
}

int planrt_outfile_commit(planrt_outfile_t *f, char *why, size_t n)
{
	wait_if_stopping();
	const char *step = "write";
	int e = finish(f, &step);
	char again[512] = "";
	if (!e && !f->in_place && classify("the output", f->path, again, sizeof again) != 1) {
		e = EEXIST; /* the target became something else while it was written */
		step = "rename";
	}
	lock_unless_stopping();
	if (!e && !f->in_place && rename(f->tmp, f->path) != 0) {
		e = errno;
		step = "rename";
	}
	if (e && !f->in_place)
		unlink(f->tmp);
	planrt_outfile_pending(NULL);
	pthread_mutex_unlock(&pending_lock);
	if (e) {
		if (again[0])
			say(why, n, "%s", again);
		else
			say(why, n, "cannot write '%s' (%s of '%s' failed: %s); check free space and permissions", f->path, step,
			    f->tmp, strerror(e));
		errno = e;
		return -1;
	}
	if (!f->in_place) {
		char dir[4096];
		snprintf(dir, sizeof dir, "%s", f->path);
		int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return 0;
}

void planrt_outfile_close(planrt_outfile_t *f)
{
	if (f->fp)
		fclose(f->fp);
	else if (f->fd >= 0)
		close(f->fd);
	f->fp = NULL;
	f->fd = -1;
}

void planrt_outfile_discard(planrt_outfile_t *f)
{
	planrt_outfile_close(f);
	if (!f->in_place && f->tmp[0])
		unlink(f->tmp);
	planrt_outfile_pending(NULL);
}

/* ------------------------------------------------------------------ signals and leftovers */

/* the temporary file this process is writing, removed if a signal ends the process */
static char pending_tmp[4160];

void planrt_outfile_pending(const char *tmp)
{
	snprintf(pending_tmp, sizeof pending_tmp, "%s", tmp ? tmp : "");
}

void planrt_outfile_remove_pending(void)
{
	if (pending_tmp[0])
		unlink(pending_tmp);
}

void planrt_outfile_stop(void)
{
	pthread_mutex_lock(&pending_lock);
	stopping = 1;
	planrt_outfile_remove_pending();
	pthread_mutex_unlock(&pending_lock);
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

/* A temporary file named PATH.tmp.PID[.more] (or .tmp.probe.PID.K) is stale when no process of
 * this host has that pid: a writer that was killed. */
void planrt_outfile_remove_stale(const char *target)
{
	char *a = strdup(target), *b = strdup(target);
	if (!a || !b) {
		free(a);
		free(b);
		return;
	}
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
