/* trace.c: --trace FILE, a Chrome-trace / Perfetto timeline of every rank in one file.
 *
 * While tracing, each rank records complete events ("ph": "X": name, category, start, duration,
 * arguments) on its own thread's stack: planrt_trace_begin_ opens one, planrt_trace_end_ closes the
 * innermost, so events nest by construction. What is recorded:
 *   run        init, resume, each step, each checkpoint, the evaluation, the final save
 *   compute    each action of the schedule (the forward or backward of a micro-batch and chunk),
 *              the prepares that post its receives, the step's update phase
 *   kernel     every GEMM (M x N x K, FLOPs), each optimizer update, each cross-entropy
 *   collective every collective planrt runs (kind, group, elements, dtype, the bytes it puts on the
 *              wire as planc explain counts them, its sequence number), blocking or started
 *   p2p        every send and receive (peer, tag, bytes)
 *   wait       every wait on a started operation (pipeline receives, buckets, prefetches)
 * Timestamps are microseconds from an origin the ranks agree on (a barrier on planrt's control
 * group right before it). At the end every rank writes its events to FILE.rank<R>.tmp.<pid>; after
 * a barrier rank 0 joins them into {"traceEvents": [...]} with a process (pid = rank) per rank
 * named after its mesh coordinates, writes FILE atomically and removes the parts. Loading it in
 * chrome://tracing or ui.perfetto.dev shows the ranks stacked. */
#define PLANRT_INTERNAL
#include "planrt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int planrt_tracing_;

typedef struct event {
	char name[64];
	const char *cat;
	double ts, dur; /* microseconds from the origin */
	char args[200];
} event_t;

static event_t *events;
static size_t nevents, capevents;
static size_t stack[64];
static int depth;
static double origin;
static char *trace_path;
static size_t dropped;
enum { MAX_EVENTS = 4000000 };

static double now_us(void)
{
	return (planrt_now() - origin) * 1e6;
}

void planrt_trace_open_(const char *path)
{
	free(trace_path);
	trace_path = strdup(path);
	planrt_comm_t ctl = planrt_control_comm_();
	int32_t x = 0;
	if (ctl) /* an origin every rank agrees on, to the barrier's precision */
		PLANRT_CHECK(planrt_allreduce(&x, &x, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	origin = planrt_now();
	planrt_tracing_ = trace_path != NULL;
}

void planrt_trace_begin_(const char *name, const char *cat)
{
	if (!planrt_tracing_)
		return;
	if (depth == (int)(sizeof stack / sizeof stack[0]))
		planrt_fatal("internal error: trace events nested more than %d deep", depth);
	if (nevents == capevents) {
		size_t cap = capevents ? 2 * capevents : 4096;
		event_t *e = cap <= MAX_EVENTS ? realloc(events, cap * sizeof *e) : NULL;
		if (!e) { /* the timeline keeps what it has; the file says how much it lost */
			dropped++;
			stack[depth++] = (size_t)-1;
			return;
		}
		events = e;
		capevents = cap;
	}
	event_t *e = &events[nevents];
	snprintf(e->name, sizeof e->name, "%s", name);
	e->cat = cat;
	e->args[0] = 0;
	e->dur = -1;
	stack[depth++] = nevents++;
	e->ts = now_us();
}

void planrt_trace_end_(const char *args)
{
	if (!planrt_tracing_ || depth == 0)
		return;
	size_t i = stack[--depth];
	if (i == (size_t)-1)
		return;
	event_t *e = &events[i];
	e->dur = now_us() - e->ts;
	if (args)
		snprintf(e->args, sizeof e->args, "%s", args);
}

void planrt_trace_args_(const char *args)
{
	if (!planrt_tracing_ || depth == 0 || stack[depth - 1] == (size_t)-1)
		return;
	snprintf(events[stack[depth - 1]].args, sizeof events[0].args, "%s", args);
}

/* JSON string content: names are ours (no control characters), quotes and backslashes escaped */
static void put_string(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
	}
}

static void write_events(FILE *f, int rank, int *first)
{
	for (size_t i = 0; i < nevents; i++) {
		const event_t *e = &events[i];
		if (e->dur < 0)
			continue; /* still open (the run ended inside it) */
		fprintf(f, "%s{\"name\":\"", *first ? "" : ",\n");
		put_string(f, e->name);
		fprintf(f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":0", e->cat, e->ts, e->dur,
			rank);
		if (e->args[0])
			fprintf(f, ",\"args\":{%s}", e->args);
		fputc('}', f);
		*first = 0;
	}
}

/* Every rank: its part, then rank 0 joins them. names: each rank's process name (rank 0 only). */
void planrt_trace_close_(const char *process_name)
{
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
		int first = 1;
		fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"", rank);
		put_string(f, process_name);
		fprintf(f, "\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", rank,
			rank);
		first = 0;
		write_events(f, rank, &first);
		if (dropped)
			fprintf(f, ",\n{\"name\":\"%zu events not recorded (over %d)\",\"ph\":\"i\",\"s\":\"p\",\"ts\":0,\"pid\":%d,"
				   "\"tid\":0}",
				dropped, MAX_EVENTS, rank);
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
	free(events);
	events = NULL;
	nevents = capevents = 0;
	depth = 0;
	free(trace_path);
	trace_path = NULL;
}
