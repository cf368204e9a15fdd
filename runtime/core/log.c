/* log.c: metrics as JSON lines, rank 0's progress line, and the clock.
 *
 * Only world rank 0 (or a program that never called planrt_init) writes the log and the progress
 * line; on other ranks these calls do nothing, so every rank can make them. Each JSON line is
 * flushed when written, so a run that dies leaves whole lines. Non-finite numbers (a diverged
 * loss) are written as null, which JSON can represent.
 *
 * The log is a stream, appended to line by line while the run goes (tail -f, a resumed run
 * appends), so it is written in place, not beside and renamed as the other outputs are; but the
 * path follows planrt_outfile's rule (a directory, FIFO, socket, block device or symbolic link is
 * refused; a character device such as /dev/null is fine). A line that cannot be written (a full
 * disk) is reported at once; training goes on (its checkpoints keep its work), and closing the
 * log reports how many lines were lost, which makes the run's exit status 1. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_outfile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static FILE *log_fp;
static char *log_path;    /* for planrt_log_truncate_ and the closing message */
static int log_errno;     /* the first write error, 0: none */
static int64_t log_lost;  /* lines not written */
static char *extra;      /* planrt_log_fields: members of the next line (NULL or "": none) */
static size_t extra_cap;

static int is_rank0(void)
{
	return planrt_world_rank_() <= 0;
}

double planrt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

planrt_result_t planrt_log_open(const char *path)
{
	return planrt_log_open_(path, 0);
}

planrt_result_t planrt_log_open_(const char *path, int append)
{
	if (!is_rank0())
		return planrt_success;
	if (log_fp)
		fclose(log_fp);
	char why[1024];
	if (planrt_outfile_check("the log", path, why, sizeof why) != 0)
		return planrt_error_(planrt_io_error, "%s", why);
	log_fp = fopen(path, append ? "a" : "w");
	if (!log_fp)
		return planrt_error_(planrt_io_error, "cannot write the log '%s': %s; check that its directory exists",
				     path, strerror(errno));
	free(log_path);
	log_path = strdup(path);
	log_errno = 0;
	log_lost = 0;
	return planrt_success;
}

/* A resumed run's log keeps the rows of the steps before the one it resumes at: the rows a dead
 * run wrote after its last checkpoint (and a torn last line) are cut, so that every step appears
 * once, as the run that continues computes it. */
planrt_result_t planrt_log_truncate_(int64_t first_step)
{
	struct stat st;
	if (!log_fp || !log_path || fstat(fileno(log_fp), &st) != 0 || !S_ISREG(st.st_mode))
		return planrt_success; /* a character device (/dev/null) is written in place: nothing to cut */
	FILE *in = fopen(log_path, "rb");
	if (!in)
		return planrt_error_(planrt_io_error, "cannot read the log '%s': %s", log_path, strerror(errno));
	char line[4096];
	long keep = 0;
	int cut = 0;
	while (!cut && fgets(line, sizeof line, in)) {
		long long step;
		size_t len = strlen(line);
		int whole = len > 0 && line[len - 1] == '\n';
		if (!whole || sscanf(line, "{\"step\":%lld,", &step) != 1 || step >= first_step)
			cut = 1;
		else
			keep = ftell(in);
	}
	fclose(in);
	if (!cut)
		return planrt_success;
	fflush(log_fp);
	if (ftruncate(fileno(log_fp), keep) != 0)
		return planrt_error_(planrt_io_error, "cannot cut the log '%s' back to step %lld: %s", log_path,
				     (long long)first_step, strerror(errno));
	return planrt_success;
}

static void put_number(const char *key, double x, int last)
{
	if (isfinite(x))
		fprintf(log_fp, "\"%s\":%.9g%s", key, x, last ? "" : ",");
	else
		fprintf(log_fp, "\"%s\":null%s", key, last ? "" : ",");
}

void planrt_log_step(int64_t step, double loss, double lr, double grad_norm, int64_t tokens, double step_ms)
{
	planrt_log_step_(step, loss, lr, grad_norm, tokens, 0, step_ms);
}

void planrt_log_step_(int64_t step, double loss, double lr, double grad_norm, int64_t tokens, int64_t samples,
		      double step_ms)
{
	if (!log_fp)
		return;
	fprintf(log_fp, "{\"step\":%lld,", (long long)step);
	put_number("loss", loss, 0);
	put_number("lr", lr, 0);
	put_number("grad_norm", grad_norm, 0);
	if (tokens > 0)
		fprintf(log_fp, "\"tokens\":%lld,", (long long)tokens);
	put_number("step_ms", step_ms, tokens <= 0 && samples <= 0);
	if (tokens > 0)
		put_number("tokens_per_s", step_ms > 0 ? (double)tokens / (step_ms * 1e-3) : 0, samples <= 0);
	if (samples > 0) {
		fprintf(log_fp, "\"samples\":%lld,", (long long)samples);
		put_number("samples_per_s", step_ms > 0 ? (double)samples / (step_ms * 1e-3) : 0, 1);
	}
	if (extra && extra[0])
		fprintf(log_fp, ",%s", extra);
	if (extra)
		extra[0] = 0;
	fputs("}\n", log_fp);
	if (fflush(log_fp) != 0 || ferror(log_fp)) {
		int e = errno ? errno : EIO;
		if (!log_errno)
			fprintf(stderr, "planrt: rank 0: cannot write the log '%s' (step %lld): %s; training goes on, the run will "
					"exit with status 1\n",
				log_path, (long long)step, strerror(e));
		log_errno = log_errno ? log_errno : e;
		log_lost++;
		clearerr(log_fp);
	}
}

void planrt_log_fields(const char *members)
{
	if (!log_fp || !members || !members[0])
		return; /* only the rank that writes the log keeps them */
	size_t have = extra ? strlen(extra) : 0, n = strlen(members);
	if (have + n + 2 > extra_cap) {
		size_t cap = (have + n + 2) * 2;
		char *grown = realloc(extra, cap);
		if (!grown)
			return; /* the line goes without these members */
		if (!extra)
			grown[0] = 0;
		extra = grown;
		extra_cap = cap;
	}
	if (have)
		extra[have++] = ',';
	memcpy(extra + have, members, n + 1);
}
int planrt_log_close(void)
{
	if (log_fp && fclose(log_fp) != 0 && !log_errno)
		log_errno = errno ? errno : EIO;
	int failed = log_fp && log_errno;
	if (failed)
		fprintf(stderr, "planrt: rank 0: the log '%s' lacks %lld line%s (%s); the run itself is complete\n", log_path,
			(long long)log_lost, log_lost == 1 ? "" : "s", strerror(log_errno));
	log_fp = NULL;
	free(log_path);
	log_path = NULL;
	return failed ? -1 : 0;
}

/* "1m03s", "2h05m09s", "7s" */
static void format_duration(double s, char *buf, size_t n)
{
	if (!isfinite(s) || s < 0)
		s = 0;
	long t = lround(s), h = t / 3600, m = t / 60 % 60, sec = t % 60;
	if (h)
		snprintf(buf, n, "%ldh%02ldm%02lds", h, m, sec);
	else if (m)
		snprintf(buf, n, "%ldm%02lds", m, sec);
	else
		snprintf(buf, n, "%lds", sec);
}

/* step is the number of steps done (1-based), elapsed_s the time they took. */
void planrt_progress(int64_t step, int64_t total, double loss, double tokens_per_s, double elapsed_s)
{
	planrt_progress_(step, total, loss, tokens_per_s, "tok/s", elapsed_s);
}

void planrt_progress_(int64_t step, int64_t total, double loss, double rate, const char *unit, double elapsed_s)
{
	if (!is_rank0())
		return;
	char eta[32];
	format_duration(step > 0 ? elapsed_s / (double)step * (double)(total - step) : 0, eta, sizeof eta);
	fprintf(stderr, "step %lld/%lld  loss %.4f  %.2e %s  ETA %s\n", (long long)step, (long long)total, loss, rate,
		unit, eta);
}
