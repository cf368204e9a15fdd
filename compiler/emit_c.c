/* emit_c.c: prints the loop-level IR as one readable C file per plan (prog.c).
 *
 * The file is the whole training program of one rank: constants for the mesh, shapes and arena
 * offsets; one function for the forward of a micro-batch, one for its backward and one for the
 * per-step gradient synchronisation; the step itself as a table of actions walked by a small
 * loop; and main(), which parses the run's options, checks the world size against the plan,
 * initialises or loads parameters, trains, logs and saves. Calls go to planrt (planrt.h,
 * planrt_kernels.h, planrt_exec.h); fused element-wise kernels are printed as loops. The output
 * compiles with -Wall -Wextra -Werror. */
#include "planc.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

typedef struct Emit {
	FILE *f;
	Graph *g;
	LProg *p;
	PlanSpec *ps;
	bool *has_offs; /* per value: OFFS arrays are needed */
	bool *has_gdims;
	int tokens, targets;
	int batch_axis_dim; /* unused */
} Emit;

static const char *ctype(DType t)
{
	switch (t) {
	case DT_I32:
		return "int32_t";
	case DT_U8:
		return "uint8_t";
	case DT_F64:
		return "double";
	case DT_BF16:
	case DT_F16:
		return "uint16_t";
	default:
		return "float";
	}
}

static int storage_root(const LProg *p, int v)
{
	while (p->buf[v].cls == BUF_VIEW && p->buf[v].view_of >= 0)
		v = p->buf[v].view_of;
	return v;
}

/* The C expression for a buffer's address. */
static void print_ptr(Emit *e, int v)
{
	int r = storage_root(e->p, v);
	const Buffer *b = &e->p->buf[r];
	if (b->cls == BUF_STATE)
		fprintf(e->f, "S%d", r);
	else
		fprintf(e->f, "((%s *)(arena + %zu))", ctype(b->dtype), b->offset);
}

static int batch_dim(const Emit *e, int v)
{
	const Value *val = &e->g->vals[v];
	if (!e->ps->batch_dim)
		return -1;
	for (int d = 0; d < val->rank; d++)
		if (val->dim_name[d] && !strcmp(val->dim_name[d], e->ps->batch_dim))
			return d;
	return -1;
}

static void print_arg(Emit *e, const Kernel *k, const KArg *a)
{
	FILE *f = e->f;
	switch (a->kind) {
	case KA_VALUE:
		print_ptr(e, a->value);
		break;
	case KA_INT:
		fprintf(f, "%lld", a->i);
		break;
	case KA_F64:
		fprintf(f, "%.17g", a->f);
		break;
	case KA_INTS:
		if (a->nints <= -1000) {
			int n = -1000 - a->nints;
			fprintf(f, "(void *const[]){");
			for (int i = 0; i < n; i++) {
				fprintf(f, i ? ", " : "");
				print_ptr(e, (int)a->ints[i]);
			}
			fprintf(f, "}");
		} else if (a->nints < 0) {
			fprintf(f, "(const int[]){");
			for (int i = 0; i < -a->nints; i++)
				fprintf(f, "%s%lld", i ? ", " : "", a->ints[i]);
			fprintf(f, "}");
		} else {
			fprintf(f, "(const int64_t[]){");
			for (int i = 0; i < a->nints; i++)
				fprintf(f, "%s%lld", i ? ", " : "", a->ints[i]);
			fprintf(f, "}");
		}
		break;
	case KA_TEXT:
		fputs(a->text, f);
		break;
	case KA_SCRATCH:
		fprintf(f, "(void *)(arena + %zu)", k->scratch_offset);
		break;
	case KA_SCALAR:
		fprintf(f, "(double)");
		print_ptr(e, a->value);
		fprintf(f, "[0] * %.17g", a->f);
		break;
	case KA_OFFS:
		if (a->i >= 0)
			fprintf(f, "OFFS%d[%lld]", a->value, a->i);
		else
			fprintf(f, "OFFS%d", a->value);
		break;
	case KA_GDIMS:
		fprintf(f, "GDIMS%d", a->value);
		break;
	}
}

/* ------------------------------------------------------------------ fused loops */

static void collect(const LExpr *x, int *loads, int *n)
{
	if (!x)
		return;
	if (x->kind == LX_LOAD) {
		for (int i = 0; i < *n; i++)
			if (loads[i] == x->value)
				goto next;
		loads[(*n)++] = x->value;
	}
next:
	collect(x->a, loads, n);
	collect(x->b, loads, n);
}

static bool contiguous(const LExpr *x, const Kernel *k)
{
	if (!x)
		return true;
	if (x->kind == LX_LOAD) {
		long long s = 1;
		bool same = true, scalar = true;
		for (int d = k->rank - 1; d >= 0; d--) {
			if (x->stride[d] != s)
				same = false;
			if (x->stride[d] != 0)
				scalar = false;
			s *= k->dims[d];
		}
		if (!same && !scalar)
			return false;
	}
	return contiguous(x->a, k) && contiguous(x->b, k);
}

static void print_index(Emit *e, const LExpr *x, const Kernel *k, bool flat)
{
	if (flat) {
		bool scalar = true;
		for (int d = 0; d < k->rank; d++)
			if (x->stride[d])
				scalar = false;
		fprintf(e->f, scalar ? "0" : "i");
		return;
	}
	bool any = false;
	for (int d = 0; d < k->rank; d++)
		if (x->stride[d]) {
			fprintf(e->f, "%si%d * %lld", any ? " + " : "", d, x->stride[d]);
			any = true;
		}
	if (!any)
		fprintf(e->f, "0");
}

static void print_expr(Emit *e, const LExpr *x, const Kernel *k, bool flat)
{
	FILE *f = e->f;
	switch (x->kind) {
	case LX_LOAD: {
		bool half = e->p->buf[storage_root(e->p, x->value)].dtype == DT_BF16;
		fprintf(f, half ? "bf(v%d[" : "v%d[", x->value);
		print_index(e, x, k, flat);
		fprintf(f, half ? "])" : "]");
		return;
	}
	case LX_CONST:
		fprintf(f, "(float)%.17g", x->f);
		return;
	case LX_UNARY:
		switch (x->op) {
		case OP_SCALE:
			fprintf(f, "(");
			print_expr(e, x->a, k, flat);
			fprintf(f, " * (float)%.17g)", x->f);
			return;
		case OP_NEG:
			fprintf(f, "(-");
			print_expr(e, x->a, k, flat);
			fprintf(f, ")");
			return;
		case OP_GELU:
			fprintf(f, x->s && !strcmp(x->s, "tanh") ? "gelu_tanh(" : "gelu_erf(");
			break;
		case OP_RELU:
			fprintf(f, "relu(");
			break;
		case OP_SILU:
			fprintf(f, "silu(");
			break;
		default:
			ICE("unary op %s in a loop", op_names[x->op]);
		}
		print_expr(e, x->a, k, flat);
		fprintf(f, ")");
		return;
	case LX_BINARY: {
		const char *fn = NULL, *infix = NULL;
		switch (x->op) {
		case OP_ADD:
			infix = " + ";
			break;
		case OP_SUB:
			infix = " - ";
			break;
		case OP_MUL:
			infix = " * ";
			break;
		case OP_DIV:
			infix = " / ";
			break;
		case OP_GELU_GRAD:
			fn = x->s && !strcmp(x->s, "tanh") ? "gelu_tanh_grad" : "gelu_erf_grad";
			break;
		case OP_RELU_GRAD:
			fn = "relu_grad";
			break;
		case OP_SILU_GRAD:
			fn = "silu_grad";
			break;
		case OP_DROPOUT_GRAD:
			fn = "dropout_grad";
			break;
		default:
			ICE("binary op %s in a loop", op_names[x->op]);
		}
		if (infix) {
			fprintf(f, "(");
			print_expr(e, x->a, k, flat);
			fputs(infix, f);
			print_expr(e, x->b, k, flat);
			fprintf(f, ")");
		} else {
			fprintf(f, "%s(", fn);
			print_expr(e, x->a, k, flat);
			fprintf(f, ", ");
			print_expr(e, x->b, k, flat);
			if (x->op == OP_DROPOUT_GRAD)
				fprintf(f, ", (float)%.17g", (double)(1.0 / (1.0 - x->f)));
			fprintf(f, ")");
		}
		return;
	}
	}
}

static void print_loop(Emit *e, const Kernel *k)
{
	FILE *f = e->f;
	int loads[64], n = 0;
	collect(k->expr, loads, &n);
	fprintf(f, "\t{ /* %s, %d op%s fused */\n", op_names[e->g->ops[k->op].kind], k->nfused, k->nfused == 1 ? "" : "s");
	fprintf(f, "\t\t%s *restrict out = ", ctype(e->p->buf[k->out].dtype));
	print_ptr(e, k->out);
	fprintf(f, ";\n");
	for (int i = 0; i < n; i++) {
		fprintf(f, "\t\tconst %s *v%d = ", ctype(e->p->buf[storage_root(e->p, loads[i])].dtype), loads[i]);
		print_ptr(e, loads[i]);
		fprintf(f, ";\n");
	}
	bool flat = contiguous(k->expr, k);
	bool half = e->p->buf[storage_root(e->p, k->out)].dtype == DT_BF16;
	const char *op = k->accumulate ? "+=" : "=";
	if (flat) {
		long long total = 1;
		for (int d = 0; d < k->rank; d++)
			total *= k->dims[d];
		fprintf(f, "\t\tfor (int64_t i = 0; i < %lld; i++)\n\t\t\t", total);
		if (half)
			fprintf(f, "out[i] = tobf(%s", k->accumulate ? "bf(out[i]) + " : "");
		else
			fprintf(f, "out[i] %s ", op);
		print_expr(e, k->expr, k, true);
		fprintf(f, half ? ");\n\t}\n" : ";\n\t}\n");
		return;
	}
	long long stride[MAX_DIMS], s = 1;
	for (int d = k->rank - 1; d >= 0; d--) {
		stride[d] = s;
		s *= k->dims[d];
	}
	for (int d = 0; d < k->rank; d++) {
		for (int t = 0; t < 2 + d; t++)
			fputc('\t', f);
		fprintf(f, "for (int64_t i%d = 0; i%d < %lld; i%d++)%s\n", d, d, k->dims[d], d, d == k->rank - 1 ? " {" : "");
	}
	for (int t = 0; t < 2 + k->rank; t++)
		fputc('\t', f);
	fprintf(f, "int64_t o = ");
	for (int d = 0; d < k->rank; d++)
		fprintf(f, "%si%d * %lld", d ? " + " : "", d, stride[d]);
	fprintf(f, ";\n");
	for (int t = 0; t < 2 + k->rank; t++)
		fputc('\t', f);
	if (half)
		fprintf(f, "out[o] = tobf(%s", k->accumulate ? "bf(out[o]) + " : "");
	else
		fprintf(f, "out[o] %s ", op);
	print_expr(e, k->expr, k, false);
	fprintf(f, half ? ");\n" : ";\n");
	for (int t = 0; t < 1 + k->rank; t++)
		fputc('\t', f);
	fprintf(f, "}\n\t}\n");
}

static void print_kernel(Emit *e, const Kernel *k)
{
	if (k->only_last_micro)
		fprintf(e->f, "\tif (mb == MICRO_BATCHES - 1)\n\t");
	if (k->kind == KER_LOOP) {
		print_loop(e, k);
		return;
	}
	const Op *op = &e->g->ops[k->op];
	FILE *f = e->f;
	size_t base = k->scratch_offset + (k->scratch + 63) / 64 * 64;
	if (k->nconv) { /* bf16 operands: computed on f32 copies */
		fprintf(f, "\t{\n");
		for (int c = 0; c < k->nconv; c++) {
			int v = k->args[k->conv_arg[c]].value;
			fprintf(f, "\t\tfloat *c%d = (float *)(arena + %zu);\n", c, base + k->conv_offset[c]);
			if (k->conv_in[c]) {
				fprintf(f, "\t\tplanrt_k_bf16_to_f32(");
				print_ptr(e, v);
				fprintf(f, ", c%d, %lld);\n", c, e->p->buf[storage_root(e->p, v)].elems);
			}
		}
		fprintf(f, "\t");
	}
	fprintf(f, "\t%s(", k->fn);
	for (int i = 0; i < k->nargs; i++) {
		if (i)
			fprintf(f, ", ");
		int conv = -1;
		for (int c = 0; c < k->nconv; c++)
			if (k->conv_arg[c] == i)
				conv = c;
		if (conv >= 0)
			fprintf(f, "c%d", conv);
		else
			print_arg(e, k, &k->args[i]);
	}
	fprintf(f, "); /* %s%s%s */\n", op_names[op->kind], op->scope && *op->scope ? " in " : "",
		op->scope ? op->scope : "");
	if (k->nconv) {
		for (int c = 0; c < k->nconv; c++) {
			if (!k->conv_out[c])
				continue;
			int v = k->args[k->conv_arg[c]].value;
			fprintf(f, "\t\tplanrt_k_f32_to_bf16(c%d, ", c);
			print_ptr(e, v);
			fprintf(f, ", %lld);\n", e->p->buf[storage_root(e->p, v)].elems);
		}
		fprintf(f, "\t}\n");
	}
}

/* ------------------------------------------------------------------ the program */

static void mark_arrays(Emit *e)
{
	for (int i = 0; i < e->p->nk; i++) {
		const Kernel *k = &e->p->k[i];
		for (int a = 0; a < k->nargs; a++) {
			if (k->args[a].kind == KA_OFFS)
				e->has_offs[k->args[a].value] = true;
			if (k->args[a].kind == KA_GDIMS)
				e->has_gdims[k->args[a].value] = true;
		}
	}
	if (e->tokens >= 0)
		e->has_offs[e->tokens] = true;
}

static void print_prelude(Emit *e, const char *source_path)
{
	FILE *f = e->f;
	PlanSpec *ps = e->ps;
	fprintf(f, "/* prog.c: generated by planc %s from %s, plan %s for model %s. Do not edit.\n", PLANC_VERSION,
		source_path, ps->plan->name, ps->model->name);
	fprintf(f, " * mpirun -np %d ./prog --steps K --data FILE [--init W.safetensors] [--save OUT.safetensors]\n", ps->world);
	fprintf(f, " *        [--log run.jsonl] [--seed S] */\n");
	fprintf(f, "#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n");
	fprintf(f, "#include \"planrt.h\"\n#include \"planrt_exec.h\"\n#include \"planrt_kernels.h\"\n#include \"planrt_math.h\"\n\n");
	fprintf(f, "enum { NAXES = %d, WORLD = %d, MICRO_BATCHES = %d };\n", ps->naxes, ps->world,
		ps->micro_batches > 0 ? ps->micro_batches : 1);
	fprintf(f, "static const int axis_sizes[NAXES] = {");
	for (int a = 0; a < ps->naxes; a++)
		fprintf(f, "%s%d", a ? ", " : "", ps->axes[a].size);
	fprintf(f, "};\nstatic const char *const axis_names[NAXES] = {");
	for (int a = 0; a < ps->naxes; a++)
		fprintf(f, "%s\"%s\"", a ? ", " : "", ps->axes[a].name);
	fprintf(f, "};\n");
	long long mb_rows = ps->batch / (ps->micro_batches > 0 ? ps->micro_batches : 1);
	fprintf(f, "static const int64_t GLOBAL_BATCH = %lld, MICRO_ROWS = %lld;\n", ps->batch, mb_rows);
	fprintf(f, "static const size_t ARENA_BYTES = %zu;\n", e->p->arena_bytes);
	fprintf(f, "static unsigned char *arena;\nstatic uint64_t step_seed;\n\n");
	/* element-wise helpers for fused loops */
	fprintf(f,
		"static inline float relu(float x) { return x > 0 ? x : 0; }\n"
		"static inline float relu_grad(float y, float dy) { return y > 0 ? dy : 0; }\n"
		"static inline float gelu_erf(float x) { return planrt_gelu_erf(x); }\n"
		"static inline float gelu_erf_grad(float x, float dy) { return planrt_gelu_erf_grad(x, dy); }\n"
		"static inline float gelu_tanh(float x)\n{\n"
		"\treturn 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n}\n"
		"static inline float gelu_tanh_grad(float x, float dy)\n{\n"
		"\tfloat u = 0.79788456080286536f * (x + 0.044715f * x * x * x), t = tanhf(u);\n"
		"\tfloat du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n"
		"\treturn dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);\n}\n"
		"static inline float silu(float x) { return planrt_silu(x); }\n"
		"static inline float silu_grad(float x, float dy) { return planrt_silu_grad(x, dy); }\n"
		"static inline float dropout_grad(uint8_t keep, float dy, float scale) { return keep ? dy * scale : 0; }\n"
		"/* bf16 storage: widen to f32 for arithmetic, round to nearest even when stored */\n"
		"static inline float bf(uint16_t x)\n{\n\tuint32_t u = (uint32_t)x << 16;\n\tfloat f;\n\tmemcpy(&f, &u, 4);\n\treturn f;\n}\n"
		"static inline uint16_t tobf(float f)\n{\n\tuint32_t u;\n\tmemcpy(&u, &f, 4);\n"
		"\tif ((u & 0x7fffffffu) > 0x7f800000u)\n\t\treturn (uint16_t)((u >> 16) | 0x40);\n"
		"\treturn (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);\n}\n\n");
}

static bool zero_on(const Emit *e)
{
	return e->ps->zero_stage >= 1 && e->ps->zero_axis >= 0 && e->ps->axes[e->ps->zero_axis].size > 1;
}

/* Elements of a parameter's whole local (tensor-parallel) block, before any ZeRO split. */
static long long block_elems(const Emit *e, int v)
{
	long long n = 1;
	for (int d = 0; d < e->g->vals[v].rank; d++)
		n *= e->p->buf[v].ldims[d];
	return n;
}

static bool low_precision(const Emit *e)
{
	return e->ps->param_dtype == DT_BF16;
}

/* The elements of parameter v this rank updates (its ZeRO chunk), as memplan.c decided. */
static long long zero_chunk(const Emit *e, int v)
{
	for (int i = 0; i < e->p->nparams; i++)
		if (e->p->params[i] == v)
			return e->p->owned[i];
	ICE("%%%d is not a parameter of this stage", v);
}

static void print_state(Emit *e)
{
	FILE *f = e->f;
	Graph *g = e->g;
	fprintf(f, "/* parameters and gradient accumulators (local blocks) */\n");
	for (int v = 0; v < g->nvals; v++) {
		const Buffer *b = &e->p->buf[v];
		if (b->cls != BUF_STATE || (b->first < 0 && g->vals[v].role != ROLE_PARAM))
			continue;
		if (g->vals[v].def < 0 || g->ops[g->vals[v].def].stage != e->p->stage)
			continue;
		char lay[128];
		layout_string(g, v, lay, sizeof lay);
		fprintf(f, "static %s *S%d; /* %s [", ctype(b->dtype), v, g->vals[v].name ? g->vals[v].name : "?");
		for (int d = 0; d < g->vals[v].rank; d++)
			fprintf(f, "%s%lld", d ? ", " : "", b->ldims[d]);
		fprintf(f, "]%s%s */\n", lay[0] ? " " : "", lay);
	}
	for (int i = 0; i < e->p->nparams; i++)
		fprintf(f, "static float *M%d, *V%d; /* optimizer moments of %s */\n", e->p->params[i], e->p->params[i],
			g->vals[e->p->params[i]].name);
	if (zero_on(e))
		for (int i = 0; i < e->p->nparams; i++)
			fprintf(f, "static float *GS%d; /* this rank's ZeRO chunk of the gradient of %s */\n", e->p->params[i],
				g->vals[e->p->params[i]].name);
	if (low_precision(e))
		for (int i = 0; i < e->p->nparams; i++)
			fprintf(f, "static float *MW%d; /* f32 master weights of %s */\n", e->p->params[i],
				g->vals[e->p->params[i]].name);
	fprintf(f, "\n/* global offsets of this rank's blocks, and global shapes (for RNG counters) */\n");
	for (int v = 0; v < g->nvals; v++) {
		if (e->has_offs[v])
			fprintf(f, "static int64_t OFFS%d[%d], OFFS0_%d[%d];\n", v, g->vals[v].rank ? g->vals[v].rank : 1, v,
				g->vals[v].rank ? g->vals[v].rank : 1);
		if (e->has_gdims[v]) {
			fprintf(f, "static const int64_t GDIMS%d[%d] = {", v, g->vals[v].rank);
			int bd = batch_dim(e, v);
			for (int d = 0; d < g->vals[v].rank; d++)
				fprintf(f, "%s%lld", d ? ", " : "", d == bd ? e->ps->batch : g->vals[v].dim[d]);
			fprintf(f, "};\n");
		}
	}
	fprintf(f, "\nstatic void setup_offsets(void)\n{\n");
	for (int v = 0; v < g->nvals; v++) {
		if (!e->has_offs[v])
			continue;
		for (int d = 0; d < g->vals[v].rank; d++) {
			int axis = -1;
			for (int a = 0; a < e->ps->naxes; a++)
				if (g->vals[v].lay.on[a] == d)
					axis = a;
			if (axis >= 0)
				fprintf(f, "\tOFFS0_%d[%d] = (int64_t)planrt_mesh_coord(%d) * %lld;\n", v, d, axis, e->p->buf[v].ldims[d]);
			else
				fprintf(f, "\tOFFS0_%d[%d] = 0;\n", v, d);
		}
		fprintf(f, "\tmemcpy(OFFS%d, OFFS0_%d, sizeof OFFS%d);\n", v, v, v);
	}
	fprintf(f, "}\n\n/* the batch dim of every block moves with the micro-batch */\nstatic void set_micro_batch(int mb)\n{\n");
	bool any = false;
	for (int v = 0; v < g->nvals; v++) {
		int bd = batch_dim(e, v);
		if (!e->has_offs[v] || bd < 0)
			continue;
		fprintf(f, "\tOFFS%d[%d] = OFFS0_%d[%d] + (int64_t)mb * MICRO_ROWS;\n", v, bd, v, bd);
		any = true;
	}
	if (!any)
		fprintf(f, "\t(void)mb;\n");
	fprintf(f, "}\n\n");
}

static void print_phase(Emit *e, Phase ph, const char *name, const char *params)
{
	FILE *f = e->f;
	fprintf(f, "static void %s(%s)\n{\n", name, params);
	int count = 0;
	bool started = false;
	if (ph == PH_BACKWARD)
		fprintf(f, "\t(void)mb;\n");
	for (int i = 0; i < e->p->nk; i++)
		if (e->p->k[i].phase == ph) {
			const Kernel *k = &e->p->k[i];
			print_kernel(e, k);
			count++;
			if (k->kind == KER_CALL && strstr(k->fn, "_start"))
				started = true;
			/* give MPI a chance to move overlapped buckets between the big kernels */
			if (started && ph == PH_BACKWARD && k->kind == KER_CALL && !strcmp(k->fn, "planrt_k_matmul_f32"))
				fprintf(f, "\tbucket_progress();\n");
		}
	if (!count)
		fprintf(f, "\t/* nothing in this phase */\n");
	fprintf(f, "}\n\n");
}

static unsigned loss_axes(const Emit *e)
{
	unsigned mask = 0;
	if (e->p->loss < 0)
		return 0;
	for (int a = 0; a < e->ps->naxes; a++)
		if (e->g->vals[e->p->loss].lay.on[a] == LAYOUT_P)
			mask |= 1u << a;
	return mask;
}

static const char *opt_kind(OptimizerKind k)
{
	switch (k) {
	case OPT_SGD:
		return "planrt_opt_sgd";
	case OPT_MOMENTUM:
		return "planrt_opt_momentum";
	case OPT_ADAM:
		return "planrt_opt_adam";
	default:
		return "planrt_opt_adamw";
	}
}

static void print_main(Emit *e)
{
	FILE *f = e->f;
	Graph *g = e->g;
	PlanSpec *ps = e->ps;
	LProg *p = e->p;
	/* the step: zero accumulators, micro-batches, synchronisation, clipping, update */
	/* ZeRO 2/3 move gradients into their chunks every micro-batch, so the accumulators restart
	 * with each micro-batch; otherwise they accumulate over the step */
	bool per_micro = zero_on(e) && ps->zero_stage >= 2;
	fprintf(f, "static void zero_accumulators(void)\n{\n");
	for (int v = 0; v < g->nvals; v++)
		if (p->buf[v].cls == BUF_STATE && g->vals[v].grad_of >= 0 && p->buf[v].first >= 0 &&
		    p->k[p->buf[v].first].phase == PH_BACKWARD)
			fprintf(f, "\tmemset(S%d, 0, %zu);\n", v, p->buf[v].bytes);
	fprintf(f, "}\n\nstatic void zero_gradients(void)\n{\n");
	fprintf(f, per_micro ? "\t/* accumulators: every micro-batch, in the schedule */\n" : "\tzero_accumulators();\n");
	if (zero_on(e))
		for (int i = 0; i < p->nparams; i++)
			fprintf(f, "\tmemset(GS%d, 0, %lld);\n", p->params[i], zero_chunk(e, p->params[i]) * 4);
	fprintf(f, "}\n\n");
	/* parameters updated on this rank, with their gradient after synchronisation */
	int nupd = 0;
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].kind == OP_OPTIMIZER_STEP && g->ops[i].stage == p->stage)
			nupd++;
	fprintf(f, "/* grad16: a bf16 gradient, widened to f32 one parameter at a time into `widened` */\n");
	fprintf(f, "typedef struct Update { float *param, *grad, *m, *v; int64_t n; double replicas; const char *name; const uint16_t *grad16; } Update;\n");
	fprintf(f, "static Update updates[%d];\n\n", nupd ? nupd : 1);
	fprintf(f, "static void setup_updates(void)\n{\n");
	int u = 0;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind != OP_OPTIMIZER_STEP || op->stage != p->stage)
			continue;
		int param = op->in[0], grad = op->in[1];
		double replicas = 1;
		for (int a = 0; a < ps->naxes; a++)
			if (g->vals[grad].lay.on[a] == LAYOUT_R && !(zero_on(e) && a == ps->zero_axis))
				replicas *= ps->axes[a].size;
		if (zero_on(e)) {
			/* the optimizer updates this rank's chunk of the parameter with its chunk of the gradient */
			long long n = block_elems(e, param), c = zero_chunk(e, param);
			fprintf(f, "\t{\n\t\tint64_t lo = (int64_t)planrt_mesh_coord(%d) * %lld, n = %lld - lo;\n", ps->zero_axis, c, n);
			/* f32: the chunk of the parameter itself; bf16: the f32 master chunk */
			const char *target = low_precision(e) ? arena_printf(g->arena, "MW%d", param)
				: ps->zero_stage >= 3 ? arena_printf(g->arena, "S%d", param) : arena_printf(g->arena, "S%d + lo", param);
			fprintf(f, "\t\tupdates[%d] = (Update){%s, GS%d, M%d, V%d, n < 0 ? 0 : n > %lld ? %lld : n, %g, \"%s\", NULL};\n",
				u, target, param, param, param, c, c, replicas, g->vals[param].name);
			fprintf(f, "\t\t(void)lo;\n\t}\n");
		} else if (low_precision(e)) {
			fprintf(f, "\tupdates[%d] = (Update){MW%d, NULL, M%d, V%d, %lld, %g, \"%s\", ", u, param, param, param,
				p->buf[param].elems, replicas, g->vals[param].name);
			print_ptr(e, grad);
			fprintf(f, "};\n");
		} else {
			fprintf(f, "\tupdates[%d] = (Update){S%d, ", u, param);
			print_ptr(e, grad);
			fprintf(f, ", M%d, V%d, %lld, %g, \"%s\", NULL};\n", param, param, p->buf[param].elems, replicas,
				g->vals[param].name);
		}
		u++;
	}
	fprintf(f, "}\n\n");
	fprintf(f, "/* Mixed precision: f32 master weights, bf16 copies for compute; gradients widened to f32. */\n");
	fprintf(f, "static void master_to_params(void)\n{\n");
	if (low_precision(e) && zero_on(e)) { /* this rank's master chunk into its place in the bf16 copy */
		if (ps->zero_stage < 3)
			fprintf(f, "\tint64_t lo;\n");
		for (int i = 0; i < p->nparams; i++) {
			int v = p->params[i];
			if (ps->zero_stage < 3) {
				fprintf(f, "\tlo = (int64_t)planrt_mesh_coord(%d) * %lld;\n", ps->zero_axis, zero_chunk(e, v));
				fprintf(f, "\tplanrt_k_f32_to_bf16(MW%d, S%d + lo, %lld);\n", v, v, zero_chunk(e, v));
			} else {
				fprintf(f, "\tplanrt_k_f32_to_bf16(MW%d, S%d, %lld);\n", v, v, zero_chunk(e, v));
			}
		}
	} else if (low_precision(e)) {
		for (int i = 0; i < p->nparams; i++)
			fprintf(f, "\tplanrt_k_f32_to_bf16(MW%d, S%d, %lld);\n", p->params[i], p->params[i], p->buf[p->params[i]].elems);
	}
	long long widest = 1;
	for (int i = 0; i < p->nparams; i++)
		if (p->buf[p->params[i]].elems > widest)
			widest = p->buf[p->params[i]].elems;
	fprintf(f, "}\n\nstatic float *widened; /* %lld floats: the largest parameter */\n", widest);
	fprintf(f, "static float *gradient_f32(const Update *u)\n{\n\tif (!u->grad16)\n\t\treturn u->grad;\n"
		   "\tplanrt_k_bf16_to_f32(u->grad16, widened, u->n);\n\treturn widened;\n}\n\n");
	fprintf(f, "/* ZeRO 1 and 2: every rank updated its chunk; gather the whole parameters back. */\n");
	fprintf(f, "static float *zero_scratch;\nstatic void gather_updated(void)\n{\n");
	if (zero_on(e) && ps->zero_stage < 3) {
		fprintf(f, "\tint64_t lo;\n");
		for (int i = 0; i < p->nparams; i++) {
			int v = p->params[i];
			fprintf(f, "\tlo = (int64_t)planrt_mesh_coord(%d) * %lld;\n", ps->zero_axis, zero_chunk(e, v));
			fprintf(f, "\tplanrt_allgather_flat(S%d + lo, S%d, %lld, %s, planrt_axis_comm(%d), zero_scratch);\n", v, v,
				block_elems(e, v), low_precision(e) ? "planrt_bf16" : "planrt_f32", ps->zero_axis);
		}
	} else {
		fprintf(f, "\t(void)zero_scratch;\n");
	}
	fprintf(f, "}\n\n");
	fprintf(f, "static const planrt_opt_t optimizer = {%s, %.17g, %.17g, %.17g, %.17g, %.17g, %.17g};\n",
		opt_kind(ps->optimizer), ps->lr, ps->beta1, ps->beta2, ps->eps, ps->weight_decay, ps->momentum);
	fprintf(f, "static const double CLIP = %.17g;\n\n", ps->clip);
	fprintf(f,
		"/* Clips by the global gradient norm (each replicated block counted once), then updates. */\n"
		"static double update(int64_t step)\n{\n"
		"\tdouble local = 0;\n"
		"\tfor (int i = 0; i < %d; i++)\n"
		"\t\tlocal += planrt_sum_squares(gradient_f32(&updates[i]), (size_t)updates[i].n) / updates[i].replicas;\n"
		"\tdouble norm = sqrt(planrt_world_sum(local));\n"
		"\tdouble coef = CLIP > 0 && norm > CLIP ? CLIP / (norm + 1e-6) : 1.0;\n"
		"\tdouble lr = planrt_lr_at(%.17g, step, %d, %d, %.17g);\n"
		"\tfor (int i = 0; i < %d; i++) {\n"
		"\t\tfloat *grad = gradient_f32(&updates[i]);\n"
		"\t\tif (coef != 1.0)\n"
		"\t\t\tplanrt_k_scale_f32(grad, grad, updates[i].n, coef);\n"
		"\t\tplanrt_opt_step(&optimizer, lr, step + 1, updates[i].param, grad, updates[i].m, updates[i].v,\n"
		"\t\t\t\t(size_t)updates[i].n);\n\t}\n"
		"\tmaster_to_params();\n"
		"\tgather_updated();\n"
		"\treturn norm;\n}\n\n",
		nupd, ps->lr, ps->warmup, ps->total_steps, ps->min_lr, nupd);
	/* schedule table */
	fprintf(f, "/* One step as a table of actions (F: forward of a micro-batch, B: its backward). */\n");
	fprintf(f, "typedef enum { ACT_F, ACT_B, ACT_SYNC } Act;\nstatic const struct { Act act; int micro; } schedule[] = {\n");
	for (int m = 0; m < (ps->micro_batches > 0 ? ps->micro_batches : 1); m++)
		fprintf(f, "\t{ACT_F, %d}, {ACT_B, %d},\n", m, m);
	fprintf(f, "\t{ACT_SYNC, 0},\n};\n\n");
	/* parameter init / load / save */
	fprintf(f, "/* flat_axis >= 0: the parameter is stored as this rank's ZeRO-3 chunk of its local block */\n");
	fprintf(f, "typedef struct ParamInfo { float **data; const char *name; int rank; int64_t gdims[%d], ldims[%d]; int axis[%d]; int kind; double a, b; int flat_axis; } ParamInfo;\n",
		MAX_DIMS, MAX_DIMS, MAX_DIMS);
	fprintf(f, "static const ParamInfo params[] = {\n");
	int np = 0;
	for (int i = 0; i < p->nparams; i++) {
		int v = p->params[i];
		const Value *val = &g->vals[v];
		fprintf(f, "\t{&%s%d, \"%s\", %d, {", low_precision(e) ? "MW" : "S", v, val->name, val->rank);
		for (int d = 0; d < val->rank; d++)
			fprintf(f, "%s%lld", d ? ", " : "", val->dim[d]);
		fprintf(f, "}, {");
		for (int d = 0; d < val->rank; d++)
			fprintf(f, "%s%lld", d ? ", " : "", p->buf[v].ldims[d]);
		fprintf(f, "}, {");
		for (int d = 0; d < val->rank; d++) {
			int axis = -1;
			for (int a = 0; a < ps->naxes; a++)
				if (val->lay.on[a] == d)
					axis = a;
			fprintf(f, "%s%d", d ? ", " : "", axis);
		}
		fprintf(f, "}, %d, %.17g, %.17g, %d},\n", val->init_kind, val->init_a, val->init_b,
			zero_on(e) && (ps->zero_stage >= 3 || low_precision(e)) ? ps->zero_axis : -1);
		np++;
	}
	fprintf(f, "};\nenum { NPARAMS = %d };\n\n", np);
	fprintf(f,
		"static void block_offsets(const ParamInfo *pi, int64_t *offs)\n{\n"
		"\tfor (int d = 0; d < pi->rank; d++)\n"
		"\t\toffs[d] = pi->axis[d] >= 0 ? (int64_t)planrt_mesh_coord(pi->axis[d]) * pi->ldims[d] : 0;\n}\n\n");
	fprintf(f,
		"static int64_t block_elems_of(const ParamInfo *pi)\n{\n\tint64_t n = 1;\n"
		"\tfor (int d = 0; d < pi->rank; d++)\n\t\tn *= pi->ldims[d];\n\treturn n;\n}\n\n");
	fprintf(f,
		"static void init_params(uint64_t seed, const char *init_path)\n{\n"
		"\tplanrt_st_t st = NULL;\n"
		"\tif (init_path)\n\t\tPLANRT_CHECK(planrt_st_open(init_path, &st));\n"
		"\tfor (int i = 0; i < NPARAMS; i++) {\n"
		"\t\tconst ParamInfo *pi = &params[i];\n\t\tint64_t offs[%d], n = block_elems_of(pi);\n\t\tblock_offsets(pi, offs);\n"
		"\t\tfloat *dst = pi->flat_axis >= 0 ? malloc(sizeof(float) * (size_t)n) : *pi->data;\n"
		"\t\tif (!dst)\n\t\t\tplanrt_fatal(\"out of memory initialising %%s\", pi->name);\n"
		"\t\tif (st)\n\t\t\tPLANRT_CHECK(planrt_st_read_block(st, pi->name, pi->rank, pi->gdims, pi->ldims, offs, dst));\n"
		"\t\telse\n\t\t\tplanrt_init_block(dst, pi->rank, pi->gdims, pi->ldims, offs, pi->kind, pi->a, pi->b, seed, pi->name);\n"
		"\t\tif (pi->flat_axis >= 0) { /* keep this rank's chunk */\n"
		"\t\t\tint64_t c = planrt_flat_chunk(n, planrt_axis_comm(pi->flat_axis)), lo = planrt_mesh_coord(pi->flat_axis) * c;\n"
		"\t\t\tfor (int64_t j = 0; j < c; j++)\n\t\t\t\t(*pi->data)[j] = lo + j < n ? dst[lo + j] : 0.0f;\n"
		"\t\t\tfree(dst);\n\t\t}\n"
		"\t}\n\tif (st)\n\t\tplanrt_st_close(st);\n}\n\n",
		MAX_DIMS);
	fprintf(f,
		"/* Gathers every parameter whole (all-gather along each split axis) and rank 0 writes them. */\n"
		"static void save_params(const char *path)\n{\n"
		"\tplanrt_st_tensor_t *t = calloc(NPARAMS, sizeof *t);\n"
		"\tfloat **full = calloc(NPARAMS, sizeof *full);\n"
		"\tif (!t || !full)\n\t\tplanrt_fatal(\"out of memory saving %%s\", path);\n"
		"\tfor (int i = 0; i < NPARAMS; i++) {\n"
		"\t\tconst ParamInfo *pi = &params[i];\n"
		"\t\tint64_t dims[%d], n = 1;\n"
		"\t\tfor (int d = 0; d < pi->rank; d++) {\n\t\t\tdims[d] = pi->ldims[d];\n\t\t\tn *= pi->ldims[d];\n\t\t}\n"
		"\t\tfloat *cur = malloc(sizeof(float) * (size_t)n);\n"
		"\t\tif (!cur)\n\t\t\tplanrt_fatal(\"out of memory saving %%s\", path);\n"
		"\t\tif (pi->flat_axis >= 0) {\n"
		"\t\t\tint64_t c = planrt_flat_chunk(n, planrt_axis_comm(pi->flat_axis));\n"
		"\t\t\tfloat *tmp = malloc(sizeof(float) * (size_t)(c * axis_sizes[pi->flat_axis]));\n"
		"\t\t\tif (!tmp)\n\t\t\t\tplanrt_fatal(\"out of memory saving %%s\", path);\n"
		"\t\t\tplanrt_allgather_flat(*pi->data, cur, n, planrt_f32, planrt_axis_comm(pi->flat_axis), tmp);\n"
		"\t\t\tfree(tmp);\n"
		"\t\t} else {\n\t\t\tmemcpy(cur, *pi->data, sizeof(float) * (size_t)n);\n\t\t}\n"
		"\t\tfor (int d = 0; d < pi->rank; d++) {\n"
		"\t\t\tif (pi->axis[d] < 0)\n\t\t\t\tcontinue;\n"
		"\t\t\tint k = axis_sizes[pi->axis[d]];\n"
		"\t\t\tfloat *next = malloc(sizeof(float) * (size_t)n * (size_t)k), *scratch = malloc(sizeof(float) * (size_t)n * (size_t)k);\n"
		"\t\t\tif (!next || !scratch)\n\t\t\t\tplanrt_fatal(\"out of memory saving %%s\", path);\n"
		"\t\t\tplanrt_allgather_dim(cur, next, pi->rank, dims, d, planrt_f32, planrt_axis_comm(pi->axis[d]), scratch);\n"
		"\t\t\tfree(scratch);\n\t\t\tfree(cur);\n\t\t\tcur = next;\n\t\t\tdims[d] *= k;\n\t\t\tn *= k;\n\t\t}\n"
		"\t\tfull[i] = cur;\n"
		"\t\tt[i].name = pi->name;\n\t\tt[i].dtype = planrt_f32;\n\t\tt[i].rank = pi->rank;\n"
		"\t\tfor (int d = 0; d < pi->rank; d++)\n\t\t\tt[i].dims[d] = pi->gdims[d];\n"
		"\t\tt[i].data = cur;\n\t}\n"
		"\tint rank = 0;\n\tfor (int a = 0; a < NAXES; a++)\n\t\trank |= planrt_mesh_coord(a);\n"
		"\tif (rank == 0)\n\t\tPLANRT_CHECK(planrt_st_write(path, t, NPARAMS));\n"
		"\tfor (int i = 0; i < NPARAMS; i++)\n\t\tfree(full[i]);\n\tfree(full);\n\tfree(t);\n}\n\n",
		MAX_DIMS);
	/* main */
	fprintf(f,
		"static void usage_error(const char *msg, const char *arg)\n{\n"
		"\tplanrt_fatal(\"%%s%%s; usage: prog --steps K --data FILE [--init W.safetensors] [--save OUT.safetensors] "
		"[--log run.jsonl] [--seed S]\", msg, arg ? arg : \"\");\n}\n\n");
	fprintf(f, "/* every allocation of persistent state is counted: the measured side of the memory test */\n"
		   "static size_t state_allocated;\n");
	fprintf(f, "static void *alloc_zeroed(size_t bytes)\n{\n\tvoid *p = NULL;\n\tstate_allocated += bytes;\n"
		   "\tif (posix_memalign(&p, 64, bytes ? bytes : 64))\n\t\tplanrt_fatal(\"cannot allocate %%zu bytes\", bytes);\n"
		   "\tmemset(p, 0, bytes ? bytes : 64);\n\treturn p;\n}\n\n");
	fprintf(f, "int main(int argc, char **argv)\n{\n\tint rank, world;\n");
	fprintf(f, "\tPLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));\n");
	fprintf(f, "\tif (world != WORLD)\n\t\tplanrt_fatal(\"this program was built for %%d ranks (plan %s) but runs on %%d; "
		   "launch it with mpirun -np %%d\", WORLD, world, WORLD);\n", ps->plan->name);
	fprintf(f, "\tPLANRT_CHECK(planrt_mesh_init(NAXES, axis_sizes, axis_names));\n");
	fprintf(f,
		"\tint64_t steps = -1;\n\tuint64_t seed = 1234;\n"
		"\tconst char *data_path = NULL, *init_path = NULL, *save_path = NULL, *log_path = NULL;\n"
		"\tfor (int i = 1; i < argc; i++) {\n"
		"\t\tconst char *a = argv[i];\n"
		"\t\tif (i + 1 >= argc)\n\t\t\tusage_error(\"missing value after \", a);\n"
		"\t\tchar *end;\n"
		"\t\tif (!strcmp(a, \"--steps\")) {\n\t\t\tsteps = strtoll(argv[++i], &end, 10);\n"
		"\t\t\tif (*end || steps < 0)\n\t\t\t\tusage_error(\"--steps needs a non-negative integer, not \", argv[i]);\n"
		"\t\t} else if (!strcmp(a, \"--seed\")) {\n\t\t\tseed = strtoull(argv[++i], &end, 10);\n"
		"\t\t\tif (*end)\n\t\t\t\tusage_error(\"--seed needs an integer, not \", argv[i]);\n"
		"\t\t} else if (!strcmp(a, \"--data\"))\n\t\t\tdata_path = argv[++i];\n"
		"\t\telse if (!strcmp(a, \"--init\"))\n\t\t\tinit_path = argv[++i];\n"
		"\t\telse if (!strcmp(a, \"--save\"))\n\t\t\tsave_path = argv[++i];\n"
		"\t\telse if (!strcmp(a, \"--log\"))\n\t\t\tlog_path = argv[++i];\n"
		"\t\telse\n\t\t\tusage_error(\"unknown option \", a);\n\t}\n"
		"\tif (steps < 0 || !data_path)\n\t\tusage_error(\"--steps and --data are required\", NULL);\n");
	/* allocate */
	fprintf(f, "\tarena = alloc_zeroed(ARENA_BYTES);\n\tstate_allocated -= ARENA_BYTES;\n");
	fprintf(f, "\t/* a canary in every arena word: the highest word found changed after training is the\n"
		   "\t * arena's measured high-water mark */\n");
	fprintf(f, "\tfor (size_t w = 0; w < ARENA_BYTES / 8; w++)\n\t\tmemcpy(arena + 8 * w, &(uint64_t){0x5A17C0DE5A17C0DEull}, 8);\n");
	/* persistent state, exactly as memplan.c sized it */
	int moments = ps->optimizer == OPT_ADAM || ps->optimizer == OPT_ADAMW ? 2 : ps->optimizer == OPT_MOMENTUM ? 1 : 0;
	for (int v = 0; v < g->nvals; v++)
		if (p->buf[v].alloc_bytes)
			fprintf(f, "\tS%d = alloc_zeroed(%zu);\n", v, p->buf[v].alloc_bytes);
	for (int i = 0; i < p->nparams; i++) {
		int v = p->params[i];
		size_t m = p->moment_bytes[i];
		fprintf(f, "\tM%d = %s;\n\tV%d = %s;\n", v, m && moments >= 1 ? arena_printf(g->arena, "alloc_zeroed(%zu)", m) : "NULL",
			v, m && moments >= 2 ? arena_printf(g->arena, "alloc_zeroed(%zu)", m) : "NULL");
		if (p->gchunk_bytes[i])
			fprintf(f, "\tGS%d = alloc_zeroed(%zu);\n", v, p->gchunk_bytes[i]);
		if (p->master_bytes[i])
			fprintf(f, "\tMW%d = alloc_zeroed(%zu);\n", v, p->master_bytes[i]);
	}
	fprintf(f, p->zero_scratch_bytes ? "\tzero_scratch = alloc_zeroed(%zu);\n" : "\t(void)zero_scratch;\n", p->zero_scratch_bytes);
	fprintf(f, p->widened_bytes ? "\twidened = alloc_zeroed(%zu);\n" : "\t(void)widened;\n", p->widened_bytes);
	for (int b = 0; b < p->nbuckets; b++)
		fprintf(f, "\tBUCKETBUF%d = alloc_zeroed(%zu);\n", b, p->bucket_bytes[b]);
	fprintf(f, "\tsetup_offsets();\n\tsetup_updates();\n\tinit_params(seed, init_path);\n\tmaster_to_params();\n\tgather_updated();\n");
	/* data */
	const Value *tok = &g->vals[e->tokens];
	int sdim = tok->rank - 1;
	long long vocab = 256;
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].kind == OP_EMBED && storage_root(p, g->ops[i].in[1]) == e->tokens) {
			vocab = g->vals[g->ops[i].in[0]].dim[0];
			break;
		}
	fprintf(f, "\tplanrt_data_t data;\n\tPLANRT_CHECK(planrt_data_open(data_path, %lld, %lld, &data));\n", vocab,
		tok->dim[sdim]);
	fprintf(f, "\tif (log_path && rank == 0)\n\t\tPLANRT_CHECK(planrt_log_open(log_path));\n");
	fprintf(f, "\tdouble start = planrt_now();\n");
	fprintf(f, "\tfor (int64_t step = 0; step < steps; step++) {\n");
	fprintf(f, "\t\tdouble t0 = planrt_now();\n\t\tstep_seed = seed * 0x9E3779B97F4A7C15ull + (uint64_t)step;\n");
	fprintf(f, "\t\tzero_gradients();\n\t\tdouble loss = 0, norm = 0;\n");
	fprintf(f, "\t\tfor (size_t a = 0; a < sizeof schedule / sizeof schedule[0]; a++) {\n");
	fprintf(f, "\t\t\tint mb = schedule[a].micro;\n\t\t\tswitch (schedule[a].act) {\n");
	fprintf(f, "\t\t\tcase ACT_F:\n\t\t\t\tset_micro_batch(mb);\n");
	fprintf(f, "\t\t\t\tplanrt_load_inputs(data, step, OFFS%d[0], %lld, %lld, OFFS%d[%d], %lld, seed, ", e->tokens,
		p->buf[e->tokens].ldims[0], tok->dim[sdim], e->tokens, sdim, p->buf[e->tokens].ldims[sdim]);
	print_ptr(e, e->tokens);
	fprintf(f, ", ");
	print_ptr(e, e->targets);
	fprintf(f, ");\n\t\t\t\tforward();\n\t\t\t\tbreak;\n");
	fprintf(f, "\t\t\tcase ACT_B:\n%s\t\t\t\tbackward(mb);\n",
		zero_on(e) && ps->zero_stage >= 2 ? "\t\t\t\tzero_accumulators();\n" : "");
	if (p->loss >= 0) {
		fprintf(f, "\t\t\t\tloss += (double)");
		print_ptr(e, p->loss);
		fprintf(f, "[0];\n");
	}
	fprintf(f, "\t\t\t\tbreak;\n\t\t\tcase ACT_SYNC:\n\t\t\t\tsync_gradients();\n\t\t\t\tnorm = update(step);\n\t\t\t\tbreak;\n\t\t\t}\n\t\t}\n");
	fprintf(f, "\t\tloss = planrt_axes_sum(loss, %uu) / MICRO_BATCHES;\n", loss_axes(e));
	fprintf(f, "\t\tdouble ms = (planrt_now() - t0) * 1e3;\n");
	fprintf(f, "\t\tint64_t tokens = GLOBAL_BATCH * %lld;\n", tok->dim[sdim]);
	fprintf(f, "\t\tif (rank == 0) {\n\t\t\tdouble lr = planrt_lr_at(%.17g, step, %d, %d, %.17g);\n", ps->lr, ps->warmup,
		ps->total_steps, ps->min_lr);
	fprintf(f, "\t\t\tif (log_path)\n\t\t\t\tplanrt_log_step(step, loss, lr, norm, tokens, ms);\n");
	fprintf(f, "\t\t\tplanrt_progress(step + 1, steps, loss, tokens / (ms / 1e3), planrt_now() - start);\n\t\t}\n\t}\n");
	fprintf(f, "\tif (save_path)\n\t\tsave_params(save_path);\n");
	fprintf(f, "\tif (rank == 0 && log_path)\n\t\tplanrt_log_close();\n");
	fprintf(f, "\tif (getenv(\"PLANRT_REPORT_MEMORY\")) {\n"
		   "\t\tsize_t high = ARENA_BYTES / 8;\n"
		   "\t\twhile (high > 0) {\n\t\t\tuint64_t w;\n\t\t\tmemcpy(&w, arena + 8 * (high - 1), 8);\n"
		   "\t\t\tif (w != 0x5A17C0DE5A17C0DEull)\n\t\t\t\tbreak;\n\t\t\thigh--;\n\t\t}\n"
		   "\t\tfprintf(stderr, \"planrt: rank %%d: memory arena_high_water=%%zu arena_planned=%%zu state=%%zu peak_rss=%%zu\\n\",\n"
		   "\t\t\trank, high * 8, ARENA_BYTES, state_allocated, planrt_peak_rss_bytes());\n\t}\n");
	fprintf(f, "\tplanrt_data_close(data);\n\tPLANRT_CHECK(planrt_finalize());\n\treturn 0;\n}\n");
}

bool emit_c(Graph *g, LProg **roles, int nroles, const char *dir, const char *source_path)
{
	internal_assert(nroles == 1);
	LProg *p = roles[0];
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "planc: error: cannot create directory '%s': %s\n", dir, strerror(errno));
		return false;
	}
	const char *path = arena_printf(g->arena, "%s/prog.c", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "planc: error: cannot write '%s': %s\n", path, strerror(errno));
		return false;
	}
	Emit e = {.f = f, .g = g, .p = p, .ps = g->ps, .tokens = -1, .targets = -1};
	e.has_offs = arena_alloc(g->arena, sizeof(bool) * (size_t)g->nvals);
	e.has_gdims = arena_alloc(g->arena, sizeof(bool) * (size_t)g->nvals);
	for (int i = 0; i < p->ninputs; i++) {
		int v = p->inputs[i];
		if (g->vals[v].dtype != DT_I32)
			continue;
		if (e.tokens < 0)
			e.tokens = v;
		else if (e.targets < 0)
			e.targets = v;
	}
	internal_assert(e.tokens >= 0 && e.targets >= 0);
	mark_arrays(&e);
	print_prelude(&e, source_path);
	print_state(&e);
	if (p->nprefetch) {
		fprintf(f, "/* ZeRO-3 parameter gathers in flight (prefetch) */\n");
		for (int i = 0; i < p->nprefetch; i++)
			fprintf(f, "static planrt_request_t GATHER%d;\n", i);
		fprintf(f, "\n");
	}
	fprintf(f, "/* gradient buckets overlapped with the backward */\n");
	for (int b = 0; b < p->nbuckets; b++)
		fprintf(f, "static planrt_bucket_t BUCKET%d;\nstatic void *BUCKETBUF%d;\n", b, b);
	if (p->nbuckets) {
		fprintf(f, "static inline void bucket_progress(void)\n{\n");
		for (int b = 0; b < p->nbuckets; b++)
			fprintf(f, "\tplanrt_bucket_progress(&BUCKET%d);\n", b);
		fprintf(f, "}\n\n");
	}
	print_phase(&e, PH_FORWARD, "forward", "void");
	print_phase(&e, PH_BACKWARD, "backward", "int mb");
	print_phase(&e, PH_STEP, "sync_gradients", "void");
	print_main(&e);
	bool ok = !ferror(f);
	if (fclose(f) != 0)
		ok = false;
	if (!ok)
		fprintf(stderr, "planc: error: writing '%s' failed\n", path);
	return ok;
}
