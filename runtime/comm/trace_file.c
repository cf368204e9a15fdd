/* trace_file.c: the --trace file's collective half. Opening agrees on the timeline's origin (a
 * barrier on planrt's control group right before core/trace.c starts recording); closing has every
 * rank write its events to FILE.rank<R>.tmp.<pid>, and after a barrier rank 0 joins them into
 * {"traceEvents": [...]}, writes FILE atomically and removes the parts. */
#define PLANRT_INTERNAL
#include "planrt.h"

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

/* Every rank: its part, then rank 0 joins them. names: each rank's process name (rank 0 only). */
void planrt_trace_close_(const char *process_name)
{
	const char *trace_path = planrt_trace_path_();
	if (!trace_path)
		return;
	planrt_tracing_ = 0;
	int rank = planrt_world_rank_() < 0 ? 0 : planrt_world_rank_();
	planrt_comm_t ctl = planrt_control_comm_();
	int world = ctl ? planrt_comm_size(ctl) : 1;
	/* the part files are named after rank 0's pid, so that every rank finds them */
	int64_t id = (int64_t)getpid();
	if (ctl)
		PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	size_t n = strlen(trace_path) + 64;
	char *part = malloc(n);
	if (!part)
		planrt_fatal("out of memory writing the trace");
	snprintf(part, n, "%s.rank%d.tmp.%lld", trace_path, rank, (long long)id);
	FILE *f = fopen(part, "w");
	int32_t bad = 0, any = 0;
	if (!f) {
		bad = 1;
	} else {
		planrt_trace_write_part_(f, rank, process_name);
		bad = fclose(f) != 0;
	}
	if (ctl)
		PLANRT_CHECK(planrt_allreduce(&bad, &any, 1, planrt_i32, planrt_max, ctl, NULL, NULL));
	else
		any = bad;
	if (rank == 0 && !any) {
		char *tmp = malloc(n);
		if (!tmp)
			planrt_fatal("out of memory writing the trace");
		snprintf(tmp, n, "%s.tmp.%lld", trace_path, (long long)id);
		FILE *out = fopen(tmp, "w");
		int ok = out != NULL;
		if (ok)
			fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"planrt --trace\"},\"traceEvents\":[\n", out);
		for (int r = 0; ok && r < world; r++) {
			snprintf(part, n, "%s.rank%d.tmp.%lld", trace_path, r, (long long)id);
			FILE *in = fopen(part, "r");
			if (!in) {
				ok = 0;
				break;
			}
			if (r)
				fputs(",\n", out);
			char buf[65536];
			size_t got;
			while ((got = fread(buf, 1, sizeof buf, in)) > 0)
				ok &= fwrite(buf, 1, got, out) == got;
			fclose(in);
		}
		if (ok)
			fputs("\n]}\n", out);
		ok = ok && fflush(out) == 0 && fsync(fileno(out)) == 0;
		if (out && fclose(out) != 0)
			ok = 0;
		if (ok && rename(tmp, trace_path) != 0)
			ok = 0;
		if (!ok) {
			unlink(tmp);
			fprintf(stderr, "planrt: rank 0: cannot write the trace '%s': %s; the run itself is complete\n", trace_path,
				strerror(errno));
		}
		free(tmp);
	} else if (rank == 0) {
		fprintf(stderr, "planrt: rank 0: cannot write the trace '%s': a rank could not write its part\n", trace_path);
	}
	int32_t done = 0;
	if (ctl) /* every part is read before any is removed */
		PLANRT_CHECK(planrt_allreduce(&done, &done, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	snprintf(part, n, "%s.rank%d.tmp.%lld", trace_path, rank, (long long)id);
	unlink(part);
	free(part);
	planrt_trace_reset_();
}
