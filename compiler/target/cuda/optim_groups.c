/* optim_groups.c: the CUDA target's multi-tensor optimizer. state.c gives the step one optimizer
 * kernel per parameter tensor (or ZeRO bucket shard), each followed, for lower-precision
 * parameters, by the cast from its f32 master weights: for a 350M-parameter GPT that is 388
 * optimizer launches and 388 casts a step, each a few microseconds of launch for a few
 * microseconds of memory traffic. Here a run of them becomes one launch of
 * planrt_cu_optimizer_multi over a table of (parameter, gradient, gradient dtype, moments,
 * elements, low-precision copy) entries (runtime/include/planrt_optim_math.h), which the runtime
 * uploads to the device at the run's first step and reuses.
 *
 * A run is the optimizer kernels of one phase, printed one after another, on one device stream,
 * with the same scalars (optimizer, learning rate and schedule, betas, eps, decay, momentum, the
 * step and the clipping coefficient), and the cast that follows each (from its f32 parameter to
 * a bf16 or f16 one, the same elements). Only the run's first kernel may wait for an event and
 * only its last may record one, so the schedule's ordering is the same; tensors whose storage
 * (the buffer a view is of) appears twice end a run, so no two entries write the same memory.
 * The entries' arguments are the kernel table's (KARG), so the argument contract stays
 * kernel_table.h's. The C and LLVM targets keep their per-tensor calls: the multi-tensor launch
 * runs the per-tensor kernel's element update on the same elements, so the numbers do not
 * change.
 *
 * The gradient norm's sums of squares (one per tensor, two launches each: the blocks' partial sums
 * and their total) become two launches of planrt_cu_sum_squares_multi the same way: a run of
 * them into one accumulator on one stream. The multi-tensor kernel adds each tensor's elements in
 * the per-tensor kernel's order and the totals into the accumulator in the run's order, so the
 * norm does not change either. ZeRO's sums over bucket shards (sum_squares_shard) stay per
 * call. */
#include "target/target.h"

#include <stdlib.h>
#include <string.h>

int cuda_storage_of(const LProg *p, int b)
{
	while (b >= 0 && p->buf[b].cls == BUF_VIEW)
		b = p->buf[b].view_of;
	return b;
}

static int buf_arg(const Kernel *k, int index)
{
	const KArg *a = &k->args[index];
	return a->kind == KA_BUF ? a->buf : -1;
}

static bool same_arg(const KArg *a, const KArg *b)
{
	return a->kind == b->kind && a->buf == b->buf && a->i == b->i && a->f == b->f && a->axis == b->axis &&
	       a->stride == b->stride;
}

/* the arguments an entry does not carry: every optimizer of a run has the same */
static bool same_scalars(const Kernel *a, const Kernel *b)
{
	static const int per_tensor[] = {KARG_INDEX(OPTIMIZER, param), KARG_INDEX(OPTIMIZER, grad),
					 KARG_INDEX(OPTIMIZER, gt),    KARG_INDEX(OPTIMIZER, m),
					 KARG_INDEX(OPTIMIZER, v),     KARG_INDEX(OPTIMIZER, n)};
	if (a->nargs != b->nargs)
		return false;
	for (int i = 0; i < a->nargs; i++) {
		bool skip = false;
		for (size_t j = 0; j < sizeof per_tensor / sizeof per_tensor[0]; j++)
			skip |= per_tensor[j] == i;
		if (!skip && !same_arg(&a->args[i], &b->args[i]))
			return false;
	}
	return true;
}

static bool groupable(const Kernel *k, const Kernel *first)
{
	return k->stream == first->stream && k->stream != STREAM_HOST && !k->only_last_micro &&
	       kernel_device[k->kind].mode == KDEV_CALL;
}

/* whether k, the kernel after optimizer o, is o's cast to a lower-precision parameter */
static bool cast_of(const Kernel *k, const Kernel *o)
{
	if (k->kind != K_CAST || k->nwaits)
		return false;
	DType to = (DType)KARG(k, CAST, to)->i;
	return buf_arg(k, KARG_INDEX(CAST, src)) == buf_arg(o, KARG_INDEX(OPTIMIZER, param)) &&
	       (DType)KARG(k, CAST, from)->i == DT_F32 && (to == DT_BF16 || to == DT_F16) &&
	       same_arg(KARG(k, CAST, n), KARG(o, OPTIMIZER, n));
}

/* whether the run that starts at `first` writes storage s already; marks it */
static bool seen(int *run_of, int first, int s)
{
	if (run_of[s] == first)
		return true;
	run_of[s] = first;
	return false;
}

/* The run that starts at optimizer kernel `first`: the index of its last kernel. */
static int run_end(const LProg *p, int first, int *run_of)
{
	const Kernel *f = &p->k[first];
	int last = first;
	bool cast_next = true; /* the last kernel is an optimizer: a cast may follow */
	seen(run_of, first, cuda_storage_of(p, buf_arg(f, KARG_INDEX(OPTIMIZER, param))));
	for (int j = first + 1; j < p->nk && !p->k[last].event; j++) {
		const Kernel *k = &p->k[j];
		if (k->phase != f->phase)
			continue; /* printed in another phase's function */
		if (!groupable(k, f))
			break;
		bool cast = cast_next && cast_of(k, &p->k[last]);
		if (!cast && (k->kind != K_OPTIMIZER || k->nwaits || !same_scalars(k, f)))
			break;
		int s = cuda_storage_of(p, buf_arg(k, cast ? KARG_INDEX(CAST, dst) : KARG_INDEX(OPTIMIZER, param)));
		if (seen(run_of, first, s))
			break;
		last = j;
		cast_next = !cast;
	}
	return last;
}

/* The run of sums of squares into one accumulator that starts at kernel `first`: its last kernel.
 * They only read, so a tensor may appear twice. */
static int sumsq_run_end(const LProg *p, int first)
{
	const Kernel *f = &p->k[first];
	int last = first;
	for (int j = first + 1; j < p->nk && !p->k[last].event; j++) {
		const Kernel *k = &p->k[j];
		if (k->phase != f->phase)
			continue;
		if (!groupable(k, f) || k->kind != K_SUM_SQUARES || k->nwaits ||
		    !same_arg(KARG(k, SUM_SQUARES, acc), KARG(f, SUM_SQUARES, acc)))
			break;
		last = j;
	}
	return last;
}

int *cuda_optim_groups(const LProg *p)
{
	int *group = malloc(sizeof(int) * (size_t)(p->nk ? p->nk : 1));
	int *run_of = malloc(sizeof(int) * (size_t)(p->nbuf ? p->nbuf : 1)); /* [storage]: the run writing it */
	if (!group || !run_of)
		ICE("out of memory");
	for (int i = 0; i < p->nk; i++)
		group[i] = CUDA_OPT_ALONE;
	for (int b = 0; b < p->nbuf; b++)
		run_of[b] = -1;
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		if (group[i] != CUDA_OPT_ALONE || (k->kind != K_OPTIMIZER && k->kind != K_SUM_SQUARES) || !groupable(k, k))
			continue;
		int last = k->kind == K_OPTIMIZER ? run_end(p, i, run_of) : sumsq_run_end(p, i);
		if (last == i)
			continue;
		group[i] = last;
		for (int j = i + 1; j <= last; j++)
			if (p->k[j].phase == k->phase)
				group[j] = CUDA_OPT_MEMBER;
	}
	free(run_of);
	return group;
}

/* the entries' fields, planrt_om_entry_t's order, as the kernel table's arguments of each optimizer
 * and its cast (where a field comes from the cast and there is none: absent) */
static void print_entry(Emit *e, const LProg *p, const Kernel *o, const Kernel *cast)
{
	static const struct {
		bool from_cast;
		int index;
		const char *absent;
	} fields[] = {{false, KARG_INDEX(OPTIMIZER, param), NULL}, {false, KARG_INDEX(OPTIMIZER, grad), NULL},
		      {false, KARG_INDEX(OPTIMIZER, m), NULL},	   {false, KARG_INDEX(OPTIMIZER, v), NULL},
		      {true, KARG_INDEX(CAST, dst), "NULL"},	   {false, KARG_INDEX(OPTIMIZER, n), NULL},
		      {false, KARG_INDEX(OPTIMIZER, gt), NULL},	   {true, KARG_INDEX(CAST, to), "0"}};
	FILE *f = emit_file(e);
	fprintf(f, "\t\t\t{");
	for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
		fprintf(f, "%s", i ? ", " : "");
		if (fields[i].from_cast && !cast)
			fprintf(f, "%s", fields[i].absent);
		else
			emit_arg(e, fields[i].from_cast ? cast : o, fields[i].index);
	}
	fprintf(f, "}, /* %s */\n", o->note ? o->note : p->buf[buf_arg(o, KARG_INDEX(OPTIMIZER, param))].name);
}

static void print_sumsq_group(Emit *e, const int *group, int first, const char *stream)
{
	const LProg *p = emit_prog(e);
	FILE *f = emit_file(e);
	const Kernel *s = &p->k[first];
	int count = 0;
	for (int j = first; j <= group[first]; j++)
		count += p->k[j].phase == s->phase;
	fprintf(f, "\t{ /* the sums of squares of %d tensors in two launches (optim_groups.c) */\n", count);
	fprintf(f, "\t\tstatic planrt_cu_table_t table;\n\t\tconst planrt_om_sq_entry_t entries[%d] = {\n", count);
	for (int j = first; j <= group[first]; j++) {
		const Kernel *k = &p->k[j];
		if (k->phase != s->phase)
			continue;
		static const int fields[] = {KARG_INDEX(SUM_SQUARES, x), KARG_INDEX(SUM_SQUARES, n),
					     KARG_INDEX(SUM_SQUARES, weight), KARG_INDEX(SUM_SQUARES, t)};
		fprintf(f, "\t\t\t{");
		for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
			fprintf(f, "%s", i ? ", " : "");
			emit_arg(e, k, fields[i]);
		}
		fprintf(f, ", 0},\n");
	}
	fprintf(f, "\t\t};\n\t\tplanrt_cu_sum_squares_multi(&table, entries, %d, ", count);
	emit_arg(e, s, KARG_INDEX(SUM_SQUARES, acc));
	fprintf(f, ", %s);\n\t}\n", stream);
}

void cuda_print_optim_group(Emit *e, const int *group, int first, const char *stream)
{
	const LProg *p = emit_prog(e);
	FILE *f = emit_file(e);
	const Kernel *o = &p->k[first];
	if (o->kind == K_SUM_SQUARES) {
		print_sumsq_group(e, group, first, stream);
		return;
	}
	int count = 0;
	for (int j = first; j <= group[first]; j++)
		count += p->k[j].phase == o->phase && p->k[j].kind == K_OPTIMIZER;
	fprintf(f, "\t{ /* the optimizer over %d tensors in one launch (optim_groups.c) */\n", count);
	fprintf(f, "\t\tstatic planrt_cu_table_t table;\n\t\tconst planrt_om_entry_t entries[%d] = {\n", count);
	for (int j = first; j <= group[first]; j++) {
		const Kernel *k = &p->k[j];
		if (k->phase != o->phase || k->kind != K_OPTIMIZER)
			continue;
		const Kernel *cast = NULL;
		for (int c = j + 1; c <= group[first] && !cast; c++)
			if (p->k[c].phase == o->phase && p->k[c].kind != K_CAST)
				break;
			else if (p->k[c].phase == o->phase)
				cast = &p->k[c];
		print_entry(e, p, k, cast);
	}
	fprintf(f, "\t\t};\n\t\tplanrt_cu_optimizer_multi(&table, entries, %d", count);
	static const int scalars[] = {KARG_INDEX(OPTIMIZER, kind),	   KARG_INDEX(OPTIMIZER, lr),
				      KARG_INDEX(OPTIMIZER, beta1),	   KARG_INDEX(OPTIMIZER, beta2),
				      KARG_INDEX(OPTIMIZER, eps),	   KARG_INDEX(OPTIMIZER, weight_decay),
				      KARG_INDEX(OPTIMIZER, momentum),	   KARG_INDEX(OPTIMIZER, warmup),
				      KARG_INDEX(OPTIMIZER, total),	   KARG_INDEX(OPTIMIZER, min_lr),
				      KARG_INDEX(OPTIMIZER, step),	   KARG_INDEX(OPTIMIZER, coef)};
	for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
		fprintf(f, ", ");
		emit_arg(e, o, scalars[i]);
	}
	fprintf(f, ", %s);\n\t}\n", stream);
}
