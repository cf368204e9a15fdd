/* trace.c: --trace FILE, a Chrome-trace / Perfetto timeline of every rank in one file: the
 * recording (comm/trace_file.c agrees on the origin and joins the ranks' parts).
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
 *   wait       every wait on a started operation (pipeline receives, buckets, prefetches); on a
 *              GPU also the compute stream's own waits for communication, measured on the device
 *              and added afterwards (planrt_trace_complete_) on a track of their own (tid 1)
 * Timestamps are microseconds from an origin the ranks agree on (a barrier on planrt's control
 * group right before it). At the end every rank writes its events to FILE.rank<R>.tmp.<pid>; after
 * a barrier rank 0 joins them into {"traceEvents": [...]} with a process (pid = rank) per rank
 * named after its mesh coordinates, writes FILE atomically and removes the parts. Loading it in
 * chrome://tracing or ui.perfetto.dev shows the ranks stacked. */
#define PLANRT_INTERNAL
#include "planrt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int planrt_tracing_;

typedef struct event {
	char name[64];
	const char *cat;
	double ts, dur; /* microseconds from the origin */
	int tid;        /* 0: the rank's thread; 1: its GPU's compute stream */
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

/* Starts recording for FILE, with now as the origin (comm/trace_file.c calls it right after the
 * barrier the ranks agree on it with). */
void planrt_trace_start_(const char *path)
{
	free(trace_path);
	trace_path = path ? strdup(path) : NULL;
	origin = planrt_now();
	planrt_tracing_ = trace_path != NULL;
}

const char *planrt_trace_path_(void)
{
	return trace_path;
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
	e->tid = 0;
	stack[depth++] = nevents++;
	e->ts = now_us();
}

/* a finished event whose times were measured elsewhere (planrt_now() seconds): a device's */
void planrt_trace_complete_(const char *name, const char *cat, int tid, double start_s, double dur_s, const char *args)
{
	if (!planrt_tracing_)
		return;
	planrt_trace_begin_(name, cat);
	size_t i = stack[--depth];
	if (i == (size_t)-1)
		return;
	event_t *e = &events[i];
	e->ts = (start_s - origin) * 1e6;
	e->dur = dur_s * 1e6;
	e->tid = tid;
	if (args)
		snprintf(e->args, sizeof e->args, "%s", args);
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
	int device_track = 0;
	for (size_t i = 0; i < nevents; i++)
		device_track |= events[i].tid == 1;
	if (device_track) {
		fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"GPU compute "
			   "stream: waits for communication\"}}",
			*first ? "" : ",\n", rank);
		*first = 0;
	}
	for (size_t i = 0; i < nevents; i++) {
		const event_t *e = &events[i];
		if (e->dur < 0)
			continue; /* still open (the run ended inside it) */
		fprintf(f, "%s{\"name\":\"", *first ? "" : ",\n");
		put_string(f, e->name);
		fprintf(f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", e->cat, e->ts, e->dur,
			rank, e->tid);
		if (e->args[0])
			fprintf(f, ",\"args\":{%s}", e->args);
		fputc('}', f);
		*first = 0;
	}
}

/* This rank's part of the file: its process name and sort index, its events, and a line saying
 * how many it could not record. */
void planrt_trace_write_part_(FILE *f, int rank, const char *process_name)
{
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
}

/* Stops recording and forgets every event. */
void planrt_trace_reset_(void)
{
	planrt_tracing_ = 0;
	free(events);
	events = NULL;
	nevents = capevents = 0;
	depth = 0;
	dropped = 0;
	free(trace_path);
	trace_path = NULL;
}
