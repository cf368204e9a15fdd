/* trace_file.c: the --trace file's collective half. Opening agrees on the timeline's origin (a
 * barrier on planrt's control group right before core/trace.c starts recording); closing has every
 * rank write its events to FILE.rank<R>.tmp.<pid>, and after a barrier rank 0 joins them into
 * {"traceEvents": [...]}, writes FILE by planrt_outfile's rule (beside it and renamed; a device in
 * place) and removes the parts. A failure is every rank's: the run's exit status says so. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_outfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void planrt_trace_open_(const char *path)
{
	planrt_comm_t ctl = planrt_control_comm_();
	int32_t x = 0;
	if (ctl) /* an origin every rank agrees on, to the barrier's precision */
		PLANRT_CHECK(planrt_allreduce(&x, &x, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	planrt_trace_start_(path);
}

/* rank 0: the parts joined into the trace file (planrt_outfile: written beside it and renamed).
 * 0, or -1 with the cause in why. */
static int join_parts(const char *trace_path, int world, int64_t id, char *why, size_t whyn)
{
	planrt_outfile_t out;
	if (planrt_outfile_open(&out, "--trace", trace_path, (long)id, why, whyn) != 0)
		return -1;
	FILE *f = planrt_outfile_stream(&out, why, whyn);
	int ok = f != NULL;
	if (ok)
		ok = fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"planrt --trace\"},\"traceEvents\":[\n", f) >= 0;
	size_t n = strlen(trace_path) + 64;
	char *part = malloc(n);
	if (!part)
		planrt_fatal("out of memory writing the trace");
	for (int r = 0; ok && r < world; r++) {
		snprintf(part, n, "%s.rank%d.tmp.%lld", trace_path, r, (long long)id);
		FILE *in = fopen(part, "r");
		if (!in) {
			snprintf(why, whyn, "cannot read rank %d's part '%s': %s", r, part, strerror(errno));
			ok = 0;
			break;
		}
		if (r && fputs(",\n", f) < 0)
			ok = 0;
		char buf[65536];
		size_t got;
		while (ok && (got = fread(buf, 1, sizeof buf, in)) > 0)
			ok = fwrite(buf, 1, got, f) == got;
		fclose(in);
	}
	free(part);
	if (ok && fputs("\n]}\n", f) < 0)
		ok = 0;
	if (!ok) {
		if (!why[0])
			snprintf(why, whyn, "cannot write '%.900s': %s", out.tmp, strerror(errno));
		planrt_outfile_discard(&out);
		return -1;
	}
	return planrt_outfile_commit(&out, why, whyn);
}

/* Every rank: its part, then rank 0 joins them. 0, or -1 on every rank when the file could not be
 * written (rank 0 says why). */
int planrt_trace_close_(const char *process_name)
{
	const char *trace_path = planrt_trace_path_();
	if (!trace_path)
		return 0;
	planrt_tracing_ = 0;
	int rank = planrt_world_rank_() < 0 ? 0 : planrt_world_rank_();
	planrt_comm_t ctl = planrt_control_comm_();
	int world = ctl ? planrt_comm_size(ctl) : 1;
	/* the part files are named after rank 0's pid, so that every rank finds them */
	int64_t id = (int64_t)getpid();
	if (ctl)
		PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	size_t n = strlen(trace_path) + 64;
	char *mine = malloc(n), why[1024] = "";
	if (!mine)
		planrt_fatal("out of memory writing the trace");
	snprintf(mine, n, "%s.rank%d", trace_path, rank);
	planrt_outfile_t part; /* FILE.rank<R>.tmp.<id>, never renamed: rank 0 reads it */
	int32_t bad = 0, any = 0;
	if (planrt_outfile_open(&part, "--trace", mine, (long)id, why, sizeof why) != 0) {
		bad = 1;
	} else {
		FILE *f = planrt_outfile_stream(&part, why, sizeof why);
		if (f)
			planrt_trace_write_part_(f, rank, process_name);
		bad = !f || fflush(f) != 0 || ferror(f);
		planrt_outfile_close(&part);
	}
	if (bad)
		fprintf(stderr, "planrt: rank %d: cannot write its part of the trace '%s': %s\n", rank, part.tmp,
			why[0] ? why : strerror(errno));
	if (ctl)
		PLANRT_CHECK(planrt_allreduce(&bad, &any, 1, planrt_i32, planrt_max, ctl, NULL, NULL));
	else
		any = bad;
	int32_t failed = any;
	if (rank == 0 && !any && join_parts(trace_path, world, id, why, sizeof why) != 0)
		failed = 1;
	if (rank == 0 && failed)
		fprintf(stderr, "planrt: rank 0: cannot write the trace '%s': %s; the run itself is complete\n", trace_path,
			why[0] ? why : "a rank could not write its part");
	int32_t all = 0;
	if (ctl) /* every part is read before any is removed; every rank learns the outcome */
		PLANRT_CHECK(planrt_allreduce(&failed, &all, 1, planrt_i32, planrt_max, ctl, NULL, NULL));
	else
		all = failed;
	unlink(part.tmp);
	planrt_outfile_pending(NULL);
	free(mine);
	planrt_trace_reset_();
	return all ? -1 : 0;
}
