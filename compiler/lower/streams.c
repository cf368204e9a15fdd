/* streams.c: the device schedule of every stage program (the pass after memplan).
 *
 * A GPU runs kernels on streams: each stream runs its work in order, and two streams are ordered
 * only by events (one records an event after a kernel, another waits for it). This pass decides,
 * for every kernel of the loop-level IR, the stream it runs on and the events it waits for, so that
 * the program computes exactly what the C target computes (which runs every kernel in program
 * order) while communication and copies overlap compute. The CUDA printer (emit_cuda.c) prints the
 * result; the C and LLVM targets ignore it. It is data, and tests/cuda checks it on a CPU.
 *
 *   streams   compute kernels and fused loops on the compute stream; collectives (gradient buckets,
 *             tensor- and sequence-parallel conversions, ZeRO gathers) on the communication stream;
 *             input loading and offload copies on the copy stream; what runs on the host (the
 *             offloaded optimizer, disk I/O) on the host "stream" (the host thread, in program
 *             order); pipeline sends and receives on a stream per channel and direction, so that
 *             each channel is a FIFO of its own as the MPI tags make it on the CPU. The waits of
 *             a request (finish, progress, p2p_finish) run on compute: they make compute wait for
 *             the request's event, which planrt records when it starts the operation.
 *   events    within one phase call (a phase function: a micro-batch's forward or backward of a
 *             chunk, the step, ...) kernel j waits for the latest earlier kernel i on each other
 *             stream whose memory it conflicts with (i writes what j reads or writes, or reads
 *             what j writes). Memory is compared as byte ranges: the arena's transient region,
 *             the running slot and inbox by their planned offsets (buffers that share bytes at
 *             different times conflict too), state by root buffer and view offset (a view at a
 *             coordinate-dependent offset covers its whole root). A wait is left out when stream
 *             order and the waits already made imply it (vector clocks).
 *   entry     a phase call's first kernel on a stream other than compute (the host's too) waits
 *             for the compute stream as it was when the call began (unless an in-call wait implies
 *             it), so it sees everything earlier calls wrote;
 *   exit      the call ends with the compute stream waiting for the last kernel on each other
 *             stream that no request tracks (join). Started operations (overlapped buckets,
 *             ZeRO-3 prefetches, pipeline transfers: a request argument) are not joined: their
 *             finish kernel, or the walker before a slot is reused, waits for them, which is what
 *             lets a bucket's reduction run across the rest of the backward.
 *   host      a kernel on the host waits for a device kernel by synchronising with its event; a
 *             device kernel never waits for a host kernel: it is enqueued after the host kernel
 *             returned, and so after everything the host had waited for.
 *   GEMMs     a matmul whose two operands are written in its phase call by casts from bf16 takes
 *             bf16 tensor cores (tensor_cores): its operands are bf16 values, so the products are
 *             the same and only the summation order differs; f32 matmuls keep f32 math (no TF32). */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

const char *stream_name(int stream, char *buf, size_t n)
{
	static const char *const names[] = {"compute", "comm", "copy", "host"};
	if (stream < STREAM_P2P)
		snprintf(buf, n, "%s", names[stream]);
	else
		snprintf(buf, n, "p2p%d_%s", (stream - STREAM_P2P) / 2, (stream - STREAM_P2P) % 2 ? "recv" : "send");
	return buf;
}

static bool has_request(const Kernel *k)
{
	for (int a = 0; a < k->nargs; a++)
		if (k->args[a].kind == KA_REQ || k->args[a].kind == KA_SLOTREQ)
			return true;
	return false;
}

/* A kernel runs on the host when every buffer it touches lives in host memory (offloaded state). */
static bool on_host(const LProg *p, const Kernel *k)
{
	if (k->kind == K_OFFLOAD_COPY || k->nuses + k->ndefs == 0)
		return false;
	for (int i = 0; i < k->nuses + k->ndefs; i++) {
		int b = buffer_root(p, i < k->nuses ? k->uses[i] : k->defs[i - k->nuses]);
		if (p->buf[b].cls != BUF_STATE || p->buf[b].place != PLACE_HOST)
			return false;
	}
	return true;
}

/* The stream of a kernel, by its kind and class and where its buffers live. */
static int stream_of(const LProg *p, const Kernel *k)
{
	switch (k->kind) {
	case K_SEND_START:
	case K_RECV_START: {
		int channel = k->ncomm ? k->comm[0].channel : 0;
		return STREAM_P2P + 2 * (channel > 0 ? channel : 0) + (k->kind == K_RECV_START);
	}
	case K_LOAD_INPUT:
	case K_OFFLOAD_COPY:
		return STREAM_COPY;
	case K_OFFLOAD_OPEN:
	case K_OFFLOAD_READ:
	case K_OFFLOAD_WRITE:
	case K_OFFLOAD_WAIT:
		return STREAM_HOST;
	default:
		break;
	}
	if (on_host(p, k))
		return STREAM_HOST;
	return kernel_classes[k->kind] == KC_COMM ? STREAM_COMM : STREAM_COMPUTE;
}

/* The bytes a buffer occupies: a region (0 the transient arena, 1 the running slot, 2 the running
 * inbox, 3 + b state buffer b) and a byte range in it; whole: the range is unknown (a view at a
 * coordinate-dependent offset), so the whole region counts. */
typedef struct Span {
	int region;
	long long lo, hi;
	bool whole;
} Span;

static Span span_of(const LProg *p, int b)
{
	Span s = {0, 0, 0, false};
	long long off = 0;
	while (p->buf[b].cls == BUF_VIEW) {
		const Buffer *x = &p->buf[b];
		if (x->view_axis >= 0 || x->view_axis == VIEW_SLOT)
			s.whole = true;
		off += x->view_off * dtype_bytes(p->buf[x->view_of].dtype);
		b = x->view_of;
	}
	const Buffer *x = &p->buf[b];
	switch (x->cls) {
	case BUF_ARENA:
		s.region = 0;
		off += (long long)x->offset;
		break;
	case BUF_SLOT:
		s.region = 1;
		off += (long long)x->offset;
		break;
	case BUF_INBOX:
		s.region = 2;
		off += (long long)x->offset;
		break;
	default:
		s.region = 3 + b;
		break;
	}
	s.lo = off;
	s.hi = off + (long long)p->buf[b].bytes;
	if (s.hi == s.lo)
		s.hi = s.lo + 1;
	return s;
}

static bool overlaps(Span a, Span b)
{
	return a.region == b.region && (a.whole || b.whole || (a.lo < b.hi && b.lo < a.hi));
}

static bool conflict(const LProg *p, const Kernel *a, const Kernel *b)
{
	for (int i = 0; i < a->ndefs; i++) {
		Span s = span_of(p, a->defs[i]);
		for (int j = 0; j < b->ndefs; j++)
			if (overlaps(s, span_of(p, b->defs[j])))
				return true;
		for (int j = 0; j < b->nuses; j++)
			if (overlaps(s, span_of(p, b->uses[j])))
				return true;
	}
	for (int i = 0; i < a->nuses; i++) {
		Span s = span_of(p, a->uses[i]);
		for (int j = 0; j < b->ndefs; j++)
			if (overlaps(s, span_of(p, b->defs[j])))
				return true;
	}
	return false;
}

/* the kernels of one phase call, in program order */
static bool same_call(const Kernel *a, const Kernel *b)
{
	if (a->phase != b->phase)
		return false;
	switch (a->phase) {
	case PH_PREPARE_F:
	case PH_FORWARD:
	case PH_PREPARE_B:
	case PH_BACKWARD:
		return a->chunk == b->chunk;
	default:
		return true;
	}
}

enum { NONE = -2, ENTRY = -1 };

/* One phase call: members[0..n) are kernel indices in program order. Vector clocks: vc[i * ns + s]
 * is the latest kernel of stream s known complete when kernel i completes (ENTRY: the compute
 * stream's state at the call's entry; NONE: nothing). */
static void schedule_call(LProg *p, const int *members, int n, int ns)
{
	Arena *a = p->g->arena;
	int *vc = malloc(sizeof(int) * (size_t)n * (size_t)ns);
	int *cur = malloc(sizeof(int) * (size_t)ns * (size_t)ns); /* each stream's clock after its last kernel */
	int *last = malloc(sizeof(int) * (size_t)ns);             /* each stream's last member (position) */
	int *want = malloc(sizeof(int) * (size_t)ns);
	/* the call's positions grouped by stream, in program order (start[s]: where stream s's begin;
	 * seen[s]: how many of them come before the kernel being scheduled) */
	int *start = calloc((size_t)ns + 1, sizeof(int));
	int *seen = calloc((size_t)ns, sizeof(int));
	int *on_stream = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!vc || !cur || !last || !want || !start || !seen || !on_stream)
		ICE("out of memory");
	for (int j = 0; j < n; j++)
		start[p->k[members[j]].stream + 1]++;
	for (int s = 0; s < ns; s++)
		start[s + 1] += start[s];
	for (int j = 0; j < n; j++) {
		int s = p->k[members[j]].stream;
		on_stream[start[s] + seen[s]++] = j;
	}
	memset(seen, 0, sizeof(int) * (size_t)ns);
	for (int s = 0; s < ns * ns; s++)
		cur[s] = NONE;
	for (int s = 0; s < ns; s++) {
		last[s] = -1;
		cur[s * ns + STREAM_COMPUTE] = s == STREAM_COMPUTE ? ENTRY : NONE;
	}
	for (int j = 0; j < n; j++) {
		Kernel *k = &p->k[members[j]];
		int sj = k->stream;
		int *clock = &vc[j * ns];
		memcpy(clock, &cur[sj * ns], sizeof(int) * (size_t)ns);
		/* a device kernel is enqueued after every host kernel before it returned, and so after
		 * everything the host waited for */
		for (int s = 0; s < ns && sj != STREAM_HOST; s++)
			if (cur[STREAM_HOST * ns + s] > clock[s])
				clock[s] = cur[STREAM_HOST * ns + s];
		/* on each other device stream, the latest earlier kernel not yet known complete that
		 * conflicts with k: only that stream's kernels after its clock are looked at, so the
		 * work grows with the side streams' kernels, not with the call's length squared */
		for (int s = 0; s < ns; s++) {
			want[s] = NONE;
			if (s == sj || s == STREAM_HOST)
				continue;
			for (int t = seen[s] - 1; t >= 0; t--) {
				int i = on_stream[start[s] + t];
				if (clock[s] >= i)
					break;
				if (conflict(p, &p->k[members[i]], k)) {
					want[s] = i;
					break;
				}
			}
		}
		int nw = 0;
		int *waits = arena_alloc(a, sizeof(int) * (size_t)(ns + 1));
		for (int s = 0; s < ns; s++) {
			if (want[s] == NONE || clock[s] >= want[s])
				continue;
			int i = want[s];
			waits[nw++] = members[i];
			p->k[members[i]].event = true;
			for (int t = 0; t < ns; t++)
				if (vc[i * ns + t] > clock[t])
					clock[t] = vc[i * ns + t];
		}
		/* the first kernel of a side stream in the call sees what earlier calls wrote */
		if (sj != STREAM_COMPUTE && last[sj] < 0 && clock[STREAM_COMPUTE] < ENTRY) {
			waits[nw++] = ENTRY;
			clock[STREAM_COMPUTE] = ENTRY;
		}
		clock[sj] = j;
		k->waits = waits;
		k->nwaits = nw;
		memcpy(&cur[sj * ns], clock, sizeof(int) * (size_t)ns);
		last[sj] = j;
		seen[sj]++;
	}
	/* the exit: compute waits for each side stream's last kernel no request tracks */
	int *end = &cur[STREAM_COMPUTE * ns];
	for (int s = 0; s < ns; s++) {
		if (s == STREAM_COMPUTE || s == STREAM_HOST || last[s] < 0)
			continue;
		for (int j = last[s]; j >= 0; j--) {
			Kernel *k = &p->k[members[j]];
			if (k->stream != s || has_request(k))
				continue;
			if (end[s] < j) {
				k->join = k->event = true;
				for (int t = 0; t < ns; t++)
					if (vc[j * ns + t] > end[t])
						end[t] = vc[j * ns + t];
			}
			break;
		}
	}
	free(vc);
	free(cur);
	free(last);
	free(want);
	free(start);
	free(seen);
	free(on_stream);
}

/* A matmul whose operands are both written, in its phase call, by casts from bf16 to f32. */
static void mark_tensor_cores(LProg *p, const int *members, int n)
{
	for (int j = 0; j < n; j++) {
		Kernel *k = &p->k[members[j]];
		if (k->kind != K_MATMUL || KARG(k, MATMUL, A)->kind != KA_BUF || KARG(k, MATMUL, B)->kind != KA_BUF)
			continue;
		int operands[2] = {KARG(k, MATMUL, A)->buf, KARG(k, MATMUL, B)->buf}, widened = 0;
		for (int o = 0; o < 2; o++)
			for (int i = j - 1; i >= 0; i--) {
				const Kernel *c = &p->k[members[i]];
				bool writes = false;
				for (int d = 0; d < c->ndefs; d++)
					writes |= c->defs[d] == operands[o];
				if (!writes)
					continue;
				if (c->kind == K_CAST && KARG(c, CAST, from)->i == DT_BF16 && KARG(c, CAST, to)->i == DT_F32)
					widened++;
				break;
			}
		k->tensor_cores = widened == 2;
	}
}

static void streams_prog(LProg *p)
{
	int ns = STREAM_P2P;
	for (int i = 0; i < p->nk; i++) {
		Kernel *k = &p->k[i];
		k->stream = stream_of(p, k);
		k->waits = NULL;
		k->nwaits = 0;
		k->event = k->join = false;
		if (k->stream + 1 > ns)
			ns = k->stream + 1;
	}
	int *members = malloc(sizeof(int) * (size_t)(p->nk ? p->nk : 1));
	char *done = calloc((size_t)(p->nk ? p->nk : 1), 1);
	if (!members || !done)
		ICE("out of memory");
	for (int i = 0; i < p->nk; i++) {
		if (done[i])
			continue;
		int n = 0;
		for (int j = i; j < p->nk; j++)
			if (!done[j] && same_call(&p->k[i], &p->k[j])) {
				members[n++] = j;
				done[j] = 1;
			}
		schedule_call(p, members, n, ns);
		mark_tensor_cores(p, members, n);
	}
	free(members);
	free(done);
}

bool plan_streams(Lowered *low)
{
	for (int i = 0; i < low->nprogs; i++)
		streams_prog(low->progs[i]);
	return true;
}

void streams_dump(FILE *out, const LProg *p)
{
	char sb[32];
	fprintf(out, "# stage %d%s: the device schedule\n", p->stage,
		p->role == RANKROLE_MASTER ? " (master)" : p->role == RANKROLE_WORKER ? " (workers)" : "");
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		fprintf(out, "%5d %-16s c%d %-22s %-10s", i, phase_names[k->phase], k->chunk, kernel_names[k->kind],
			stream_name(k->stream, sb, sizeof sb));
		for (int w = 0; w < k->nwaits; w++)
			if (k->waits[w] == ENTRY)
				fprintf(out, " wait entry");
			else
				fprintf(out, " wait %d", k->waits[w]);
		if (k->event)
			fprintf(out, " event");
		if (k->join)
			fprintf(out, " join");
		if (k->tensor_cores)
			fprintf(out, " tensor-cores");
		fprintf(out, "\n");
	}
}
