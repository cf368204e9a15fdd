/* verify.c: the loop-level IR's invariants, checked between back-end passes in the tests
 * (`planc ... --verify-ir`). A broken invariant is a bug in planc: it is reported with the pass
 * after which it was found, the stage, the kernel and the buffer, and verification fails.
 *
 *   arguments  every kernel has the parameters of its kind's row in the kernel table, each filled
 *              by an argument that fits its type (karg_fits), a typed buffer parameter by a
 *              buffer of that element type, a bucket by a bucket handle; every buffer argument
 *              names a live buffer of the program; mesh axes, pair groups, request handles and
 *              slot requests exist; lists are consistent
 *   names      no two live buffers of a program share a name (the printers declare each once)
 *   buffers    views stay inside the buffer they view (for every coordinate of their axis);
 *              slot and inbox buffers are touched only by the micro-batch phases; a transient
 *              buffer is touched by one phase call only
 *   kernels    communication kernels say what they send; loops have an output and a body
 *   placement  (after memplan) every region fits the arena, and two buffers of one planning group
 *              whose lifetimes overlap do not overlap in memory */
#include "lower/lower.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct Verify {
	const LProg *p;
	const char *pass;
	bool ok;
} Verify;

static void fail(Verify *V, int kernel, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(Verify *V, int kernel, const char *fmt, ...)
{
	if (!V->ok)
		return;
	V->ok = false;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "planc: internal error: IR after %s, stage %d", V->pass, V->p->stage);
	if (kernel >= 0)
		fprintf(stderr, ", kernel %d (%s, %s)", kernel, kernel_names[V->p->k[kernel].kind],
			phase_names[V->p->k[kernel].phase]);
	fprintf(stderr, ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

static bool live_buffer(Verify *V, int ki, int b)
{
	const LProg *p = V->p;
	if (b < 0 || b >= p->nbuf) {
		fail(V, ki, "buffer index %d out of range", b);
		return false;
	}
	if (p->buf[b].cls == BUF_NONE) {
		fail(V, ki, "buffer %s is not on this stage", p->buf[b].name);
		return false;
	}
	return true;
}

/* the element type a typed buffer parameter takes (-1: any) */
static int param_dtype(KParamType t)
{
	switch (t) {
	case KPT_F32_IN:
	case KPT_F32_OUT:
		return DT_F32;
	case KPT_I32_IN:
	case KPT_I32_OUT:
		return DT_I32;
	case KPT_U8_OUT:
		return DT_U8;
	case KPT_F64_IN:
	case KPT_F64_OUT:
		return DT_F64;
	case KPT_BF16_IN:
		return DT_BF16;
	case KPT_F16_IN:
		return DT_F16;
	default:
		return -1;
	}
}

/* The arguments against the kind's parameters in the kernel table. */
static void check_params(Verify *V, int ki)
{
	const LProg *p = V->p;
	const Kernel *k = &p->k[ki];
	int n = kernel_nparams[k->kind];
	if (n >= 0 && k->nargs != n) {
		fail(V, ki, "%d arguments where the kernel table gives %d", k->nargs, n);
		return;
	}
	for (int a = 0; a < k->nargs; a++) {
		const KArg *x = &k->args[a];
		const char *name = n >= 0 ? kernel_params[k->kind][a].name : "buffer";
		if (!karg_fits(k->kind, a, x)) {
			fail(V, ki, "argument %d (%s, %s) cannot take a %s", a, name,
			     n >= 0 ? kparam_type_names[kernel_params[k->kind][a].type] : "BUF", karg_kind_name(x->kind));
			continue;
		}
		if (n < 0)
			continue;
		KParamType t = kernel_params[k->kind][a].type;
		int want = param_dtype(t);
		if (x->kind == KA_BUF && want >= 0 && x->buf >= 0 && x->buf < p->nbuf &&
		    p->buf[buffer_root(p, x->buf)].dtype != (DType)want)
			fail(V, ki, "argument %d (%s) is %s buffer %s where %s is taken", a, name,
			     dtype_name(p->buf[buffer_root(p, x->buf)].dtype), p->buf[x->buf].name, dtype_name((DType)want));
		if (x->kind == KA_REQ && x->i >= 0 && x->i < p->nhandles &&
		    (p->handles[x->i].type == HANDLE_BUCKET) != (t == KPT_BUCKET))
			fail(V, ki, "argument %d (%s) names a handle of the other type", a, name);
	}
}

/* A bf16 (f16) GEMM writes C in the dtype its c_type names: f32 or bf16 (f16). */
static void check_matmul_bf16(Verify *V, int ki)
{
	const LProg *p = V->p;
	const Kernel *k = &p->k[ki];
	if ((k->kind != K_MATMUL_BF16 && k->kind != K_MATMUL_F16) || k->nargs != kernel_nparams[k->kind])
		return;
	/* the two kinds' parameters are at the same places (kernels.c asserts the sizes'; C's follow) */
	const KArg *c = &k->args[KARG_INDEX(MATMUL_BF16, C)], *t = &k->args[KARG_INDEX(MATMUL_BF16, c_type)];
	DType ab = k->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16;
	if (t->i != DT_F32 && t->i != ab)
		fail(V, ki, "a %s GEMM writes f32 or %s, not %s", dtype_name(ab), dtype_name(ab), dtype_name((DType)t->i));
	else if (c->kind == KA_BUF && c->buf >= 0 && c->buf < p->nbuf && p->buf[buffer_root(p, c->buf)].dtype != (DType)t->i)
		fail(V, ki, "C is %s buffer %s where c_type says %s", dtype_name(p->buf[buffer_root(p, c->buf)].dtype),
		     p->buf[c->buf].name, dtype_name((DType)t->i));
}

/* A 16-bit variant's storage type is bf16 or f16, and every buffer of its IN and OUT parameters is
 * stored in it; its ACC buffers are stored as its `acc` says, f32 or the storage type. */
static void check_storage_16(Verify *V, int ki)
{
	const LProg *p = V->p;
	const Kernel *k = &p->k[ki];
	int s = kernel_storage_param(k->kind);
	if (s < 0 || k->nargs != kernel_nparams[k->kind])
		return;
	DType d = (DType)k->args[s].i;
	if (d != DT_BF16 && d != DT_F16) {
		fail(V, ki, "a 16-bit kernel stored as %s", dtype_name(d));
		return;
	}
	int at = kernel_acc_param(k->kind);
	DType acc = at >= 0 ? (DType)k->args[at].i : DT_F32;
	if (acc != DT_F32 && acc != d) {
		fail(V, ki, "a 16-bit kernel stored as %s sums its gradients as %s (f32 or %s)", dtype_name(d),
		     dtype_name(acc), dtype_name(d));
		return;
	}
	for (int a = 0; a < k->nargs; a++) {
		KParamType t = kernel_params[k->kind][a].type;
		const KArg *x = &k->args[a];
		DType want = t == KPT_ACC ? acc : d;
		if ((t == KPT_IN || t == KPT_OUT || t == KPT_ACC) && x->kind == KA_BUF && x->buf >= 0 && x->buf < p->nbuf &&
		    p->buf[buffer_root(p, x->buf)].dtype != want)
			fail(V, ki, "argument %d (%s) is %s buffer %s where the %s is %s", a, kernel_params[k->kind][a].name,
			     dtype_name(p->buf[buffer_root(p, x->buf)].dtype), p->buf[x->buf].name,
			     t == KPT_ACC ? "acc" : "storage", dtype_name(want));
	}
}

static void check_args(Verify *V, int ki)
{
	const LProg *p = V->p;
	const Kernel *k = &p->k[ki];
	check_params(V, ki);
	check_matmul_bf16(V, ki);
	check_storage_16(V, ki);
	for (int a = 0; a < k->nargs; a++) {
		const KArg *x = &k->args[a];
		switch (x->kind) {
		case KA_BUF:
		case KA_SCALAR:
		case KA_OFFSET:
			live_buffer(V, ki, x->buf);
			break;
		case KA_BUFS:
			for (int i = 0; i < x->n; i++)
				live_buffer(V, ki, x->bufs[i]);
			break;
		case KA_AXIS:
			if (x->i < 0 || x->i >= p->ps->naxes)
				fail(V, ki, "argument %d: mesh axis %lld does not exist", a, x->i);
			break;
		case KA_COORD:
			if (x->axis >= p->ps->naxes)
				fail(V, ki, "argument %d: mesh axis %d does not exist", a, x->axis);
			break;
		case KA_PAIR:
			if (x->i < 0 || x->i >= p->low->npairs)
				fail(V, ki, "argument %d: pair group %lld does not exist", a, x->i);
			break;
		case KA_REQ:
			if (x->i < 0 || x->i >= p->nhandles)
				fail(V, ki, "argument %d: request handle %lld does not exist", a, x->i);
			break;
		case KA_SLOTREQ:
			if (x->i < 0 || x->i >= p->nslotreqs)
				fail(V, ki, "argument %d: slot request %lld does not exist", a, x->i);
			break;
		case KA_PARAM:
			if (x->i < 0 || x->i >= p->low->nparams)
				fail(V, ki, "argument %d: parameter %lld does not exist", a, x->i);
			break;
		case KA_INTS:
			if (x->n < 0 || (x->n && !x->ints))
				fail(V, ki, "argument %d: a malformed list", a);
			break;
		default:
			break;
		}
	}
	for (int i = 0; i < k->nuses; i++)
		live_buffer(V, ki, k->uses[i]);
	for (int i = 0; i < k->ndefs; i++)
		live_buffer(V, ki, k->defs[i]);
	KernelClass c = kernel_classes[k->kind];
	if (c == KC_COMM && k->ncomm == 0)
		fail(V, ki, "a communication kernel that says nothing about what it sends");
	for (int i = 0; i < k->ncomm; i++) {
		const Comm *cm = &k->comm[i];
		if (cm->axis < 0 || cm->axis >= p->ps->naxes || cm->elems < 0)
			fail(V, ki, "communication %d has no valid group or size", i);
	}
	if (k->kind == K_LOOP && (k->out < 0 || !k->expr))
		fail(V, ki, "a loop without output or body");
}

static void check_buffers(Verify *V)
{
	const LProg *p = V->p;
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls != BUF_VIEW)
			continue;
		if (x->view_of < 0 || x->view_of >= p->nbuf || p->buf[x->view_of].cls == BUF_NONE) {
			fail(V, -1, "view %s of no buffer", x->name);
			continue;
		}
		const Buffer *base = &p->buf[x->view_of];
		long long span = x->view_off + x->elems;
		if (x->view_axis >= 0)
			span += (long long)(p->ps->axes[x->view_axis].size - 1) * x->view_stride;
		else if (x->view_axis == VIEW_SLOT && p->nslots > 0)
			span += (long long)(p->nslots - 1) * x->view_stride;
		if (x->view_off < 0 || span > base->elems || x->dtype != base->dtype)
			fail(V, -1, "view %s (elements %lld..%lld, %s) outside %s (%lld elements, %s)", x->name, x->view_off, span,
			     dtype_name(x->dtype), base->name, base->elems, dtype_name(base->dtype));
	}
	/* slot / inbox buffers only in micro-batch phases; transient buffers in one phase call */
	int *group = malloc(sizeof(int) * (size_t)p->nbuf);
	if (!group)
		ICE("out of memory");
	for (int b = 0; b < p->nbuf; b++)
		group[b] = -1;
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		bool micro = k->phase == PH_PREPARE_F || k->phase == PH_FORWARD || k->phase == PH_PREPARE_B ||
			     k->phase == PH_BACKWARD;
		int call = micro ? (int)k->phase * 1000 + k->chunk : (int)k->phase * 1000;
		for (int pass = 0; pass < 2; pass++) {
			const int *list = pass ? k->defs : k->uses;
			int cnt = pass ? k->ndefs : k->nuses;
			for (int j = 0; j < cnt; j++) {
				int r = buffer_root(p, list[j]);
				BufClass c = p->buf[r].cls;
				if ((c == BUF_SLOT || c == BUF_INBOX) && !micro)
					fail(V, i, "slot buffer %s used outside a forward or backward", p->buf[r].name);
				if (c == BUF_ARENA && p->arena_bytes) {
					if (group[r] >= 0 && group[r] != call)
						fail(V, i, "transient buffer %s used by two phase calls", p->buf[r].name);
					group[r] = call;
				}
			}
		}
	}
	free(group);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_names(Verify *V)
{
	const LProg *p = V->p;
	const char **names = malloc(sizeof(char *) * (size_t)(p->nbuf + 1));
	if (!names)
		ICE("out of memory");
	int n = 0;
	for (int b = 0; b < p->nbuf; b++)
		if (p->buf[b].cls != BUF_NONE && p->buf[b].name)
			names[n++] = p->buf[b].name;
	qsort(names, (size_t)n, sizeof *names, by_name);
	for (int i = 1; i < n; i++)
		if (!strcmp(names[i - 1], names[i])) {
			fail(V, -1, "two buffers named %s", names[i]);
			break;
		}
	free(names);
}

static void check_placement(Verify *V)
{
	const LProg *p = V->p;
	if (!p->arena_bytes && !p->nactions)
		return;
	int *idx = malloc(sizeof(int) * (size_t)(p->nbuf + 1));
	if (!idx)
		ICE("out of memory");
	int n = 0;
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls != BUF_ARENA && x->cls != BUF_SLOT && x->cls != BUF_INBOX)
			continue;
		if (x->first < 0)
			continue; /* never touched */
		size_t region = x->cls == BUF_ARENA ? p->transient_bytes : x->cls == BUF_SLOT ? p->slot_bytes : p->inbox_bytes;
		if (x->offset + x->bytes > region)
			fail(V, -1, "%s (%zu bytes at %zu) outside its region of %zu bytes", x->name, x->bytes, x->offset, region);
		idx[n++] = b;
	}
	for (int i = 0; i < n && V->ok; i++)
		for (int j = i + 1; j < n && V->ok; j++) {
			const Buffer *x = &p->buf[idx[i]], *y = &p->buf[idx[j]];
			if (x->cls != y->cls || x->group != y->group)
				continue;
			bool alive = x->first <= y->last && y->first <= x->last;
			bool overlap = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
			if (alive && overlap)
				fail(V, -1, "%s and %s are alive together (%d..%d, %d..%d) but overlap in memory", x->name, y->name,
				     x->first, x->last, y->first, y->last);
		}
	if (p->slot_offset + (size_t)p->nslots * p->slot_bytes > p->arena_bytes && p->ninbox)
		fail(V, -1, "the slots do not fit the arena");
	free(idx);
}

bool verify_ir(const Lowered *low, const char *after_pass)
{
	bool ok = true;
	for (int i = 0; i < low->nprogs; i++) {
		Verify V = {.p = low->progs[i], .pass = after_pass, .ok = true};
		for (int k = 0; k < V.p->nk && V.ok; k++)
			check_args(&V, k);
		if (V.ok)
			check_buffers(&V);
		if (V.ok)
			check_names(&V);
		if (V.ok && !strcmp(after_pass, "memplan"))
			check_placement(&V);
		ok = ok && V.ok;
	}
	return ok;
}
