/* emit_c.c: prints the loop-level IR as one readable C file (prog.c).
 *
 * The file holds only what is particular to the plan: named mesh axes; for every pipeline stage
 * its buffers by name (persistent state as pointers planrt allocates, a layer's state families as
 * the fields of a per-layer struct with one array of it a stage, transient buffers as named
 * places in the arena, a slot or an inbox), one function per phase (init, step_begin, the
 * forward and backward of each model chunk and the receives they post ahead, step, save), its
 * action table; the parameter table; and the program descriptor handed to planrt_main, which runs
 * everything that is the same for every program. Every kernel is printed as a call to the planrt
 * function of its kind (kernel_functions) with its arguments in order, or, for a fused
 * element-wise kernel, as a call of its loop function: the loop nest, printed once before the
 * phase and compiled for every instruction-set level by PLANRT_CPU_LOOP (planrt_cpu.h; the phase
 * calls the running level's); the printer adds no computation and no communication. Which kinds
 * the C target can print at all is lowered_executable()'s answer. Each run of identical layers
 * (layer_runs.c) is printed as one loop over the layer with per-layer tables, when every layer
 * prints alike (below, "runs of identical layers as loops"), for the C target and for a target
 * printing the kernels (the CUDA host program); --no-layer-loops prints them all. With several
 * stages the C target prints a loop that several stages run once, as a function each calls with
 * its own buffers (below, "one loop function for the stages"); it learns those loops' shapes in
 * two printings before the one it writes.
 * The output compiles with -Wall -Wextra -Werror. */
#include "target/target.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct Emit {
	FILE *f;
	const Lowered *low;
	const LProg *p;     /* the stage being printed */
	const char *prefix; /* its names' prefix: "s0_" with several stages, else "" */
	const EmitTarget *target; /* NULL: the C target; else the target printing the kernels (CUDA) */
	const int *load_slot;     /* a fused loop's loads print as v<load_slot[buffer]> (NULL: v<buffer>) */
	const char **param_names; /* the parameter table's entries as the file's PARAM_ enum names them */
	const char **param_macros; /* [param]: its layer's entry macro (param_layer_macros), or NULL */
	int *param_layers;         /* [param]: its layer */
	char *param_macro_defs;    /* those macros' definitions, printed before the table */
	int *param_block;          /* [param]: the layer block it starts (param_layer_blocks), or -1 */
	int *param_block_len;      /* [param]: that block's entries */
	const char **block_names;  /* [block kind]: its PARAM_ names as one macro of the layer */
	const char **block_entries; /* [block kind]: its table entries as one macro of the layer */
	const char **param_patterns; /* [param]: param_name_pattern's, or NULL */
	int nblock_kinds;
	bool loop_functions;      /* the C target: each fused loop is a function per instruction-set level */
	bool layer_loops;         /* the C target: each run of identical layers as one loop (below) */
	/* printing one layer of a run (print_runs): what differs by layer prints as a hole (a marker
	 * in the text, its value kept here), and a fused loop calls loop_as's function */
	struct Holes *holes;
	int loop_as;
	struct Fold *folds; /* the stage's runs of identical layers printed as loops */
	int nfolds;
	int *fold_of;  /* [kernel]: the fold it belongs to, or -1 */
	int *fold_pos; /* [kernel]: its place in the fold, layer by layer (0: the loop's head) */
	struct Family *families; /* the stage's state families: a field each of its per-layer struct */
	int nfamilies, capfamilies;
	/* the per-layer struct (layer_state_t): one pointer field a family, the union of every stage's
	 * families, so that a loop shared by several stages reads any stage's array of them */
	struct LayerField *fields;
	int nfields, capfields;
	const char *layer_array; /* the stage's array of the struct, one a layer: "s0_layer" */
	const char *layer_type;  /* its type: layer_state_t, or the stage's own (sN_layer_state_t) */
	bool family_macro;       /* LAYER_FAMILY, a family table's entry, is printed */
	LayerFamilies fams;         /* their members (layer_values.c); fams.fixed: every member is named
				     * by its array's entry (NAME[i]) */
	int *family_of, *family_at; /* fams's: [buffer]: its family and place there, or -1 */
	int stage_index;            /* the stage being printed: low->progs[stage_index] */
	int *nstate_entries;        /* [stage]: its state table's entries (family members are not) */
	int *nfamily_entries;       /* [stage]: its families */
	const char **family_table;  /* [stage]: the name of its families' table (stages share alike ones) */
	const char **stage_layers;  /* [stage]: its per-layer array (layer_array) */
	const char **family_texts;  /* [nfamily_tables]: the family tables printed so far, their entries */
	const char **family_names;
	int nfamily_tables;
	SymTab *loop_shapes;        /* layers as loops: the file's loop functions by their shape */
	SymTab *loop_alias;         /* a loop function's table ("s3_loop120_at") -> the one printed for its nest */
	/* several stages (the C target, layers as loops): each folded run's loop is a function that
	 * every stage whose run prints alike calls (below, "one loop function for the stages") */
	bool shared_loops;
	bool learning_shapes;       /* the printings before the last: learning the folded runs' shapes */
	bool learning_places;       /* the first of them: learning which places differ in kind by stage */
	SymTab *places_seen;        /* a run's shape with every place a table -> its PlaceKinds */
	SymTab *loop_shapes_seen;   /* the folded runs' shapes (LoopShape) */
	int nshared_fns;
	FILE *defs;         /* while printing a phase: the shared loop functions it calls first */
	SymTab *places;     /* the stage's macros of a transient buffer by layer, by name */
	const char **place_defs; /* their definitions, in order */
	int nplaces, capplaces;
};

/* A state family: state buffers, one a layer, of one kind and size (a parameter, its gradient,
 * moment or master weight in every layer of a run), held as one pointer field of the per-layer
 * struct: member i is the stage's layer_array[i].field, which loops index by the layer; the
 * family table lists it in one entry. */
typedef struct Family {
	const char *name;  /* unique in the stage, with its prefix: "s0_p_layers_block_wq" */
	const char *field; /* the struct's field: the name without the prefix */
	const char *type;  /* the pointers' type */
	const int *members; /* the stage's LayerFamilies entry's */
	int n;
} Family;

/* A field of the per-layer struct: the family of that name and type in any stage. */
typedef struct LayerField {
	const char *base; /* the family's name without the stage prefix */
	const char *name; /* base, or base_N where another type took base */
	const char *type;
	StateKind kind;
	long long elems; /* each member's, or -1 where stages' families differ */
} LayerField;

/* One value that may differ by layer: a buffer's name, a key, a parameter index, a message; or a
 * comment (type NULL). */
typedef struct Hole {
	const char *type;  /* the C type of its per-layer table's elements */
	const char *label; /* what the table is named after */
	const char *text;
	/* a transient buffer's place: ((cast *)(place + offset)) */
	const char *place, *cast;
	long long offset;
	int buf; /* the buffer named, or -1 */
	bool integer; /* an integer (a key, a parameter index): value */
	long long value;
} Hole;
typedef struct Holes {
	Hole *h;
	int n, cap;
} Holes;
#define HOLE_VALUE '\1'
#define HOLE_COMMENT '\2'

static Hole *hole(Emit *e, const char *type, const char *label, const char *text)
{
	Holes *hs = e->holes;
	if (hs->n == hs->cap) {
		hs->cap = hs->cap ? 2 * hs->cap : 64;
		hs->h = realloc(hs->h, sizeof(Hole) * (size_t)hs->cap);
		if (!hs->h)
			ICE("out of memory");
	}
	hs->h[hs->n] = (Hole){.type = type, .label = label, .text = text, .buf = -1};
	fputc(type ? HOLE_VALUE : HOLE_COMMENT, e->f);
	return &hs->h[hs->n++];
}

/* where a transient buffer lives: the arena, its micro-batch's slot or inbox (NULL: not transient) */
static const char *transient_place(const Buffer *x)
{
	return x->cls == BUF_ARENA ? "ctx->arena" : x->cls == BUF_SLOT ? "ctx->slot" : x->cls == BUF_INBOX ? "ctx->inbox" : NULL;
}

/* A program's names' prefix: "s0_" with several stages, "s0_master_" / "s0_worker_" with async
 * roles, else "". */
static const char *prog_prefix(const Lowered *low, const LProg *p)
{
	if (low->nroles > 1)
		return arena_printf(low->g->arena, "s%d_%s_", p->stage, p->role == RANKROLE_MASTER ? "master" : "worker");
	return low->nprogs > 1 ? arena_printf(low->g->arena, "s%d_", p->stage) : "";
}

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

/* A double as the shortest decimal that reads back as the same double (0.9, not
 * 0.90000000000000002): the compiler reads the same value. */
static void print_double(FILE *f, double x)
{
	char buf[40];
	for (int digits = 1; digits <= 17; digits++) {
		snprintf(buf, sizeof buf, "%.*g", digits, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	fputs(buf, f);
}

static void name(Emit *e, int b)
{
	if (e->holes) {
		const Buffer *x = &e->p->buf[b];
		const char *type = arena_printf(e->low->g->arena, "%s *", ctype(e->p->buf[buffer_root(e->p, b)].dtype));
		Hole *h = hole(e, type, NULL, arena_printf(e->low->g->arena, "%s%s", e->prefix, x->name));
		h->place = transient_place(x);
		h->cast = ctype(x->dtype);
		h->offset = (long long)x->offset;
		h->buf = b;
		return;
	}
	if (e->fams.fixed && e->family_of[b] >= 0)
		fprintf(e->f, "%s[%d].%s", e->layer_array, e->family_at[b], e->families[e->family_of[b]].field);
	else
		fprintf(e->f, "%s%s", e->prefix, e->p->buf[b].name);
}

/* A kernel's comment, " / * text * /" (a hole while printing a layer of a run: layers name it) */
static void comment(Emit *e, const char *text)
{
	if (e->holes)
		hole(e, NULL, NULL, text);
	else
		fprintf(e->f, " /* %s */", text);
}

/* s as a C string literal */
static const char *c_string(Arena *a, const char *s)
{
	size_t n = 3;
	for (const char *c = s; *c; c++)
		n += 4;
	char *out = arena_alloc(a, n), *o = out;
	*o++ = '"';
	for (const char *c = s; *c; c++) {
		if (*c == '"' || *c == '\\') {
			*o++ = '\\';
			*o++ = *c;
		} else if ((unsigned char)*c < ' ') {
			o += sprintf(o, "\\%03o", (unsigned char)*c);
		} else {
			*o++ = *c;
		}
	}
	*o++ = '"';
	*o = 0;
	return out;
}

static void axis(Emit *e, int a)
{
	fprintf(e->f, "AXIS_%s", e->low->ps->axes[a].name);
}

/* coord(axis) * stride + base, as C */
static void coord_expr(Emit *e, long long base, int a, long long stride)
{
	if (a < 0) {
		fprintf(e->f, "%lld", base);
		return;
	}
	fprintf(e->f, "(");
	if (base)
		fprintf(e->f, "%lld + ", base);
	fprintf(e->f, "(int64_t)planrt_mesh_coord(");
	axis(e, a);
	fprintf(e->f, ") * %lld)", stride);
}

/* The global offset of buffer b's block on dim d: the split axis's coordinate times the local
 * size, and on the batch dim the micro-batch's rows. */
static void offset_expr(Emit *e, int b, int d)
{
	const Buffer *x = &e->p->buf[b];
	bool any = false;
	if (block_mirrored(e->low, x, d)) { /* the first of two mirrored chunks: coord of 2 |axis| */
		coord_expr(e, 0, x->split_axis[d], x->ldims[d] / 2);
		return;
	}
	if (d < x->rank && x->split_axis[d] >= 0) {
		coord_expr(e, 0, x->split_axis[d], x->ldims[d]);
		any = true;
	}
	if (d < x->rank && x->split_outer[d] >= 0) {
		fprintf(e->f, " + ");
		coord_expr(e, 0, x->split_outer[d], x->ldims[d] * e->low->ps->axes[x->split_axis[d]].size);
	}
	if (d == x->micro_dim) {
		fprintf(e->f, "%s(int64_t)ctx->micro * %lld", any ? " + " : "", x->micro_rows);
		any = true;
	}
	if (!any)
		fprintf(e->f, "0");
}

/* Where the second half of buffer b's block on dim d starts (a block offset list's second rank
 * entries, docs/ir.md): the mirrored chunk 2 |axis| - 1 - coord, or the rows right after the first
 * half. */
static void second_half_expr(Emit *e, int b, int d)
{
	const Buffer *x = &e->p->buf[b];
	long long half = d < x->rank ? x->ldims[d] / 2 : 0;
	if (block_mirrored(e->low, x, d)) {
		coord_expr(e, (2 * e->low->ps->axes[x->split_axis[d]].size - 1) * half, x->split_axis[d], -half);
		return;
	}
	if (d >= x->rank || (x->split_axis[d] < 0 && x->micro_dim != d)) { /* a whole dim */
		fprintf(e->f, "%lld", half);
		return;
	}
	offset_expr(e, b, d);
	fprintf(e->f, " + %lld", half);
}

/* An integer argument of an enum parameter type by its name: planrt's, a mesh axis's, or none. */
static bool print_named_int(Emit *e, KParamType t, long long v)
{
	FILE *f = e->f;
	if (t == KPT_AXIS) {
		if (v < 0)
			fprintf(f, "PLANRT_NO_AXIS");
		else
			axis(e, (int)v);
		return true;
	}
	const char *name = planrt_int_name(t, v);
	if (!name)
		return false;
	fprintf(f, "%s", name);
	if (t == KPT_CKPT && (v & CKPT_COPY))
		fprintf(f, " | PLANRT_CKPT_COPY");
	return true;
}

/* Argument i of kernel k, as its parameter's type reads: enum values and parameter indices by
 * name, buffers, axes and requests by theirs. */
static void print_arg(Emit *e, const Kernel *k, int index)
{
	FILE *f = e->f;
	const KArg *a = &k->args[index];
	KParamType type = kernel_nparams[k->kind] > index ? kernel_params[k->kind][index].type : KPT_COUNT;
	if (a->kind == KA_INT && print_named_int(e, type, a->i))
		return;
	switch (a->kind) {
	case KA_BUF:
		name(e, a->buf);
		break;
	case KA_NULL:
		fprintf(f, "NULL");
		break;
	case KA_BUFS:
		fprintf(f, "(void *const[]){");
		for (int i = 0; i < a->n; i++) {
			fprintf(f, i ? ", " : "");
			name(e, a->bufs[i]);
		}
		fprintf(f, "}");
		break;
	case KA_INT: /* a layer's key: a hole */
		if (e->holes) {
			Hole *h = hole(e, "int64_t", kernel_nparams[k->kind] > index ? kernel_params[k->kind][index].name : "value",
				       arena_printf(e->low->g->arena, "%lld", a->i));
			h->integer = true;
			h->value = a->i;
		} else
			fprintf(f, "%lld", a->i);
		break;
	case KA_PARAM:
		if (e->holes) {
			Hole *h = hole(e, "int", "param", e->param_names[a->i]);
			h->integer = true;
			h->value = a->i;
		} else
			fprintf(f, "%s", e->param_names[a->i]);
		break;
	case KA_INTS:
		fprintf(f, a->i32 ? "(const int[]){" : "(const int64_t[]){");
		for (int i = 0; i < a->n; i++)
			fprintf(f, "%s%lld", i ? ", " : "", a->ints[i]);
		fprintf(f, "}");
		break;
	case KA_F64:
		print_double(f, a->f);
		break;
	case KA_DTYPE:
		fprintf(f, "%s", planrt_dtype_name((DType)a->i));
		break;
	case KA_AXIS:
		fprintf(f, "planrt_axis_comm(");
		axis(e, (int)a->i);
		fprintf(f, ")");
		break;
	case KA_PAIR:
		fprintf(f, "planrt_pair(%lld)", a->i);
		break;
	case KA_REQ:
		fprintf(f, "&%s%s", e->prefix, e->p->handles[a->i].name);
		break;
	case KA_SLOTREQ:
		fprintf(f, "&ctx->reqs[%lld]", a->i);
		break;
	case KA_COORD:
		coord_expr(e, a->i, a->axis, a->stride);
		break;
	case KA_OFFSET:
		if (a->dim >= 0) {
			(a->i ? second_half_expr : offset_expr)(e, a->buf, a->dim);
		} else {
			int rank = e->p->buf[a->buf].rank;
			fprintf(f, "(const int64_t[]){");
			for (int d = 0; d < 2 * rank; d++) {
				fprintf(f, d ? ", " : "");
				if (d < rank)
					offset_expr(e, a->buf, d);
				else
					second_half_expr(e, a->buf, d - rank);
			}
			fprintf(f, "}");
		}
		break;
	case KA_SCALAR:
		fprintf(f, "(double)");
		name(e, a->buf);
		fprintf(f, "[0] * ");
		print_double(f, a->f);
		break;
	case KA_CTX:
		fprintf(f, "ctx");
		break;
	case KA_STEP:
		fprintf(f, "ctx->step");
		break;
	case KA_STEP_SEED:
		fprintf(f, "ctx->step_seed");
		break;
	case KA_STR:
		if (e->holes)
			hole(e, "char *", "message", c_string(e->low->g->arena, a->str));
		else
			fputs(c_string(e->low->g->arena, a->str), f);
		break;
	}
}

/* ------------------------------------------------------------------ fused loops */

static void collect(const LExpr *x, int *loads, int *n, int cap)
{
	if (!x)
		return;
	if (x->kind == LX_LOAD) {
		for (int i = 0; i < *n; i++)
			if (loads[i] == x->buf)
				goto next;
		if (*n == cap)
			ICE("a fused loop reads more than %d buffers", cap);
		loads[(*n)++] = x->buf;
	}
next:
	collect(x->a, loads, n, cap);
	collect(x->b, loads, n, cap);
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
	bool any = false;
	for (int d = 0; d < k->rank; d++)
		if (x->stride[d]) {
			if (flat) {
				fprintf(e->f, "i");
				return;
			}
			fprintf(e->f, "%si%d * %lld", any ? " + " : "", d, x->stride[d]);
			any = true;
		}
	if (!any)
		fprintf(e->f, "0");
}

/* Whether x's value is a product as the compilers see it after inlining the helpers: a multiply, or
 * a helper whose last operation is one, or the negation of one. */
static bool ends_in_product(const LExpr *x)
{
	if (x->kind == LX_UNARY)
		return x->op == OP_SCALE || x->op == OP_GELU || (x->op == OP_NEG && ends_in_product(x->a));
	if (x->kind == LX_BINARY)
		return x->op == OP_MUL || x->op == OP_GELU_GRAD || x->op == OP_SILU_GRAD;
	return false;
}

bool emit_loop_sum_of_products(const LExpr *x)
{
	return x->kind == LX_BINARY && (x->op == OP_ADD || x->op == OP_SUB) && ends_in_product(x->a) &&
	       ends_in_product(x->b);
}

static void print_expr(Emit *e, const LExpr *x, const Kernel *k, bool flat)
{
	FILE *f = e->f;
	switch (x->kind) {
	case LX_LOAD: {
		DType t = e->p->buf[buffer_root(e->p, x->buf)].dtype;
		bool half = t == DT_BF16 || t == DT_F16;
		fprintf(f, t == DT_BF16 ? "bf(v%d[" : t == DT_F16 ? "hf(v%d[" : "v%d[", e->load_slot ? e->load_slot[x->buf] : x->buf);
		print_index(e, x, k, flat);
		fprintf(f, half ? "])" : "]");
		return;
	}
	case LX_CONST:
		fprintf(f, "(float)");
		print_double(f, x->f);
		return;
	case LX_UNARY:
		switch (x->op) {
		case OP_SCALE:
			fprintf(f, "(");
			print_expr(e, x->a, k, flat);
			fprintf(f, " * (float)");
			print_double(f, x->f);
			fprintf(f, ")");
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
			bool apart = emit_loop_sum_of_products(x);
			fprintf(f, "(");
			print_expr(e, x->a, k, flat);
			fputs(infix, f);
			if (apart)
				fprintf(f, "(");
			print_expr(e, x->b, k, flat);
			fprintf(f, apart ? " + 0.0f))" : ")");
		} else {
			fprintf(f, "%s(", fn);
			print_expr(e, x->a, k, flat);
			fprintf(f, ", ");
			print_expr(e, x->b, k, flat);
			if (x->op == OP_DROPOUT_GRAD) {
				fprintf(f, ", (float)");
				print_double(f, 1.0 / (1.0 - x->f));
			}
			fprintf(f, ")");
		}
		return;
	}
	}
}

static void indent(FILE *f, int n)
{
	for (int i = 0; i < n; i++)
		fputc('\t', f);
}

/* The loop nest of fused loop k over out and v<buffer> (declared by the caller), at indent base. */
static void print_loop_nest(Emit *e, const Kernel *k, int base)
{
	FILE *f = e->f;
	bool flat = contiguous(k->expr, k);
	DType out_t = e->p->buf[buffer_root(e->p, k->out)].dtype;
	bool half = out_t == DT_BF16 || out_t == DT_F16;
	const char *to = out_t == DT_F16 ? "tohf" : "tobf", *from = out_t == DT_F16 ? "hf" : "bf";
	const char *op = k->accumulate ? "+=" : "=";
	long long total = 1, stride[MAX_DIMS];
	for (int d = k->rank - 1; d >= 0; d--) {
		stride[d] = total;
		total *= k->dims[d];
	}
	int depth;
	const char *at;
	if (flat) {
		indent(f, base);
		fprintf(f, "for (int64_t i = 0; i < %lld; i++)\n", total);
		depth = base + 1;
		at = "i";
	} else {
		for (int d = 0; d < k->rank; d++) {
			indent(f, base + d);
			fprintf(f, "for (int64_t i%d = 0; i%d < %lld; i%d++)%s\n", d, d, k->dims[d], d, d == k->rank - 1 ? " {" : "");
		}
		depth = base + k->rank;
		indent(f, depth);
		fprintf(f, "int64_t o = ");
		for (int d = 0; d < k->rank; d++)
			fprintf(f, "%si%d * %lld", d ? " + " : "", d, stride[d]);
		fprintf(f, ";\n");
		at = "o";
	}
	indent(f, depth);
	if (half)
		fprintf(f, "out[%s] = %s(", at, to);
	else
		fprintf(f, "out[%s] %s ", at, op);
	if (half && k->accumulate)
		fprintf(f, "%s(out[%s]) + ", from, at);
	print_expr(e, k->expr, k, flat);
	fprintf(f, half ? ");\n" : ";\n");
	if (!flat) {
		indent(f, base + k->rank - 1);
		fprintf(f, "}\n");
	}
}

/* A fused loop in place, as a block declaring out and v<buffer> (the CUDA target's host loops). */
static void print_loop(Emit *e, const Kernel *k)
{
	FILE *f = e->f;
	int loads[64], n = 0;
	collect(k->expr, loads, &n, 64);
	fprintf(f, "\t{ /* %s, %d op%s fused */\n", k->note ? k->note : "loop", k->nfused, k->nfused == 1 ? "" : "s");
	fprintf(f, "\t\t%s *restrict out = ", ctype(e->p->buf[buffer_root(e->p, k->out)].dtype));
	name(e, k->out);
	fprintf(f, ";\n");
	for (int i = 0; i < n; i++) {
		fprintf(f, "\t\tconst %s *v%d = ", ctype(e->p->buf[buffer_root(e->p, loads[i])].dtype), loads[i]);
		name(e, loads[i]);
		fprintf(f, ";\n");
	}
	print_loop_nest(e, k, 2);
	fprintf(f, "\t}\n");
}

/* The parameters of fused loop k's function: out, then each buffer it loads. */
static void print_loop_params(Emit *e, const Kernel *k, const int *loads, int n)
{
	fprintf(e->f, "(%s *restrict out", ctype(e->p->buf[buffer_root(e->p, k->out)].dtype));
	for (int i = 0; i < n; i++)
		fprintf(e->f, ", const %s *v%d", ctype(e->p->buf[buffer_root(e->p, loads[i])].dtype), loads[i]);
	fprintf(e->f, ")");
}

/* Fused loop k as a function, compiled once per instruction-set level by PLANRT_CPU_LOOP
 * (planrt_cpu.h), which defines the table loop<index>_at the phase calls through. */
static void print_loop_function(Emit *e, const Kernel *k)
{
	FILE *f = e->f;
	int loads[64], n = 0, index = (int)(k - e->p->k);
	collect(k->expr, loads, &n, 64);
	fprintf(f, "/* %s, %d op%s fused */\nPLANRT_LOOP void %sloop%d", k->note ? k->note : "loop", k->nfused,
		k->nfused == 1 ? "" : "s", e->prefix, index);
	print_loop_params(e, k, loads, n);
	fprintf(f, "\n{\n");
	print_loop_nest(e, k, 1);
	fprintf(f, "}\nPLANRT_CPU_LOOP(%sloop%d, ", e->prefix, index);
	print_loop_params(e, k, loads, n);
	fprintf(f, ", (out");
	for (int i = 0; i < n; i++)
		fprintf(f, ", v%d", loads[i]);
	fprintf(f, "))\n\n");
}

/* The call of fused loop k's function at the running level. */
static void print_loop_call(Emit *e, const Kernel *k)
{
	FILE *f = e->f;
	int loads[64], n = 0;
	collect(k->expr, loads, &n, 64);
	const char *own = arena_printf(e->low->g->arena, "%sloop%d_at", e->prefix, e->loop_as >= 0 ? e->loop_as : (int)(k - e->p->k));
	const char *alias = e->loop_alias ? symtab_get(e->loop_alias, own) : NULL;
	fprintf(f, "\t%s[planrt_cpu_level_](", alias ? alias : own);
	name(e, k->out);
	for (int i = 0; i < n; i++) {
		fprintf(f, ", ");
		name(e, loads[i]);
	}
	fprintf(f, ");");
	comment(e, arena_printf(e->low->g->arena, "%s, %d op%s fused", k->note ? k->note : "loop", k->nfused,
				k->nfused == 1 ? "" : "s"));
	fprintf(f, "\n");
}

static void print_kernel(Emit *e, const Kernel *k)
{
	FILE *f = e->f;
	if (e->target) {
		e->target->kernel(e, k);
		return;
	}
	if (k->only_last_micro)
		fprintf(f, "\tif (ctx->micro == MICRO_BATCHES - 1)\n\t");
	if (k->kind == K_LOOP) {
		if (e->loop_functions)
			print_loop_call(e, k);
		else
			print_loop(e, k);
		return;
	}
	if (!kernel_functions[k->kind])
		ICE("kernel kind '%s' has no C function (planc build should have refused the plan)", kernel_names[k->kind]);
	fprintf(f, "\t%s(", kernel_functions[k->kind]);
	for (int i = 0; i < k->nargs; i++) {
		if (i)
			fprintf(f, ", ");
		print_arg(e, k, i);
	}
	fprintf(f, ");");
	if (k->note)
		comment(e, k->note);
	fprintf(f, "\n");
}

/* ------------------------------------------------------------------ runs of identical layers as loops */

/* A run of identical layers (layer_runs.c) printed as one loop over the layer: the body once, and
 * what differs by layer (buffers, a random stream's key, a parameter index, a message) from
 * per-layer tables indexed by the loop variable. Each layer is printed as the unrolled program
 * would print it, with those values as holes; the run folds only when every layer's text is the
 * same around the holes, so the loop runs exactly the unrolled kernels, in the same order, with
 * the same arguments. A fused loop's function is the first layer's (the same loop nest up to the
 * names of its arguments). */
typedef struct Fold {
	const LayerRun *run;
	int *kernels; /* the run's kernels in print order: layer after layer */
	char *text;   /* the first layer, holes marked */
	Holes *holes; /* [layer] */
	LayerClass *cls; /* [hole]: what its value is across the layers (layer_values.c) */
} Fold;

/* Layer t of a run as print_kernel prints it, what differs by layer as holes (kept in hs). */
static char *print_layer(Emit *e, const int *ks, int body, int t, Holes *hs)
{
	char *text = NULL;
	size_t len = 0;
	FILE *saved = e->f;
	if (!(e->f = open_memstream(&text, &len)))
		ICE("out of memory");
	e->holes = hs;
	for (int j = 0; j < body; j++) {
		e->loop_as = ks[j];
		print_kernel(e, &e->p->k[ks[t * body + j]]);
	}
	e->holes = NULL;
	e->loop_as = -1;
	if (fclose(e->f) != 0)
		ICE("out of memory");
	e->f = saved;
	return text;
}

/* Whether every layer of a run prints as its first around the holes, and fills holes of the same
 * types: then the loop is the unrolled code. */
static bool layers_alike(const char *first, const Holes *h0, const char *text, const Holes *h)
{
	if (strcmp(first, text) || h0->n != h->n)
		return false;
	for (int i = 0; i < h->n; i++)
		if ((h0->h[i].type == NULL) != (h->h[i].type == NULL) ||
		    (h->h[i].type && strcmp(h0->h[i].type, h->h[i].type)))
			return false;
	return true;
}

static void free_holes(Holes *hs, int n)
{
	for (int i = 0; i < n; i++)
		free(hs[i].h);
	free(hs);
}

/* Fused loop k's function as text, its name and its argument names (v<buffer>) numbered by first
 * appearance, without its comment: equal for two kernels whose loop nests are the same. */
static char *loop_function_shape(Emit *e, const Kernel *k)
{
	char *text = NULL, *shape = NULL;
	size_t len = 0, slen = 0;
	FILE *saved = e->f, *out;
	if (!(e->f = open_memstream(&text, &len)) || !(out = open_memstream(&shape, &slen)))
		ICE("out of memory");
	print_loop_function(e, k);
	if (fclose(e->f) != 0)
		ICE("out of memory");
	e->f = saved;
	long long seen[64];
	int nseen = 0;
	for (const char *c = strchr(text, '\n'); c && *c;) {
		if (!isalnum((unsigned char)*c) && *c != '_') {
			fputc(*c++, out);
			continue;
		}
		const char *start = c;
		while (isalnum((unsigned char)*c) || *c == '_')
			c++;
		const char *loop = strstr(start, "loop");
		if (*start == 'v' && c - start > 1 && strspn(start + 1, "0123456789") == (size_t)(c - start - 1)) {
			long long id = atoll(start + 1);
			int i = 0;
			while (i < nseen && seen[i] != id)
				i++;
			if (i == nseen && nseen < 64)
				seen[nseen++] = id;
			fprintf(out, "v#%d", i);
		} else if (loop && loop < c && strspn(loop + 4, "0123456789") == (size_t)(c - loop - 4)) {
			size_t np = strlen(e->prefix); /* the stage's prefix too: every stage runs its layers' nests */
			bool stage = (size_t)(loop - start) == np && !strncmp(start, e->prefix, np);
			fprintf(out, "%.*sloop#", stage ? 0 : (int)(loop - start), start);
		} else {
			fwrite(start, 1, (size_t)(c - start), out);
		}
	}
	if (fclose(out) != 0)
		ICE("out of memory");
	free(text);
	return shape;
}

/* Whether the fused loops of a run's layers have the first layer's loop nests, so that every
 * layer may call the first layer's functions. */
static bool loops_alike(Emit *e, const int *ks, int body, int n)
{
	bool alike = true;
	for (int j = 0; j < body && alike; j++) {
		if (e->p->k[ks[j]].kind != K_LOOP)
			continue;
		char *first = loop_function_shape(e, &e->p->k[ks[j]]);
		for (int t = 1; t < n && alike; t++) {
			char *other = loop_function_shape(e, &e->p->k[ks[t * body + j]]);
			alike = !strcmp(first, other);
			free(other);
		}
		free(first);
	}
	return alike;
}

/* Whether the target can print each of a run's n kernels in a loop over layers (the CUDA
 * target's multi-tensor optimizer keeps a table per call site: not in a loop). */
static bool target_loopable(Emit *e, const int *ks, int n)
{
	if (!e->target || !e->target->loopable)
		return true;
	for (int i = 0; i < n; i++)
		if (!e->target->loopable(e, &e->p->k[ks[i]]))
			return false;
	return true;
}

/* What each hole of a run's n layers hs is across the layers (layer_values.c), computed once: its
 * layers' texts, buffers and integers. */
static LayerClass *hole_classes(Emit *e, const Holes *hs, int n)
{
	int nh = hs[0].n;
	LayerClass *cls = calloc((size_t)nh + 1, sizeof(LayerClass));
	LayerValue *v = calloc((size_t)n, sizeof(LayerValue));
	if (!cls || !v)
		ICE("out of memory");
	for (int h = 0; h < nh; h++) {
		for (int t = 0; t < n; t++) {
			const Hole *x = &hs[t].h[h];
			v[t] = (LayerValue){.buf = x->buf, .integer = x->integer, .value = x->value, .text = x->text};
		}
		cls[h] = layer_value_class(e->p, v, n);
	}
	free(v);
	return cls;
}

/* The stage's runs that fold (each run's layers printed alike), and which kernels they hold. */
static void plan_folds(Emit *e)
{
	const LProg *p = e->p;
	Arena *a = e->low->g->arena;
	e->nfolds = 0;
	e->fold_of = arena_alloc(a, sizeof(int) * (size_t)(p->nk + 1));
	e->fold_pos = arena_alloc(a, sizeof(int) * (size_t)(p->nk + 1));
	for (int i = 0; i < p->nk; i++)
		e->fold_of[i] = -1;
	e->places = symtab_new(a);
	layer_families_init(&e->fams, p);
	e->family_of = e->fams.family_of;
	e->family_at = e->fams.family_at;
	if (!e->layer_loops)
		return;
	LayerRun *runs = arena_alloc(a, sizeof(LayerRun) * (size_t)(p->nk + 1));
	int nruns = layer_runs(p, runs, p->nk + 1);
	e->folds = arena_alloc(a, sizeof(Fold) * (size_t)(nruns + 1));
	for (int r = 0; r < nruns; r++) {
		int *ks = layer_run_kernels(p, &runs[r], a), body = runs[r].body, n = runs[r].nlayers;
		if (!target_loopable(e, ks, body * n))
			continue;
		Holes *hs = calloc((size_t)n, sizeof(Holes));
		if (!hs)
			ICE("out of memory");
		char *first = print_layer(e, ks, body, 0, &hs[0]);
		bool alike = true;
		for (int t = 1; t < n && alike; t++) {
			char *text = print_layer(e, ks, body, t, &hs[t]);
			alike = layers_alike(first, &hs[0], text, &hs[t]);
			free(text);
		}
		if (!alike || !loops_alike(e, ks, body, n)) {
			free(first);
			free_holes(hs, n);
			continue;
		}
		for (int i = 0; i < n * body; i++) {
			e->fold_of[ks[i]] = e->nfolds;
			e->fold_pos[ks[i]] = i;
		}
		e->folds[e->nfolds++] = (Fold){.run = &runs[r], .kernels = ks, .text = first, .holes = hs,
					       .cls = hole_classes(e, hs, n)};
	}
}

static void free_folds(Emit *e)
{
	for (int i = 0; i < e->nfolds; i++) {
		free(e->folds[i].text);
		free_holes(e->folds[i].holes, e->folds[i].run->nlayers);
		free(e->folds[i].cls);
	}
	e->nfolds = 0;
}

/* whether hole h has one value in every layer */
static bool hole_same(const Fold *fd, int h)
{
	return fd->cls[h].kind == LV_SAME;
}

/* whether holes h and g hold the same value in every layer (one table serves both) */
static bool holes_same(const Fold *fd, int h, int g)
{
	for (int t = 0; t < fd->run->nlayers; t++)
		if (strcmp(fd->holes[t].h[h].text, fd->holes[t].h[g].text) || strcmp(fd->holes[t].h[h].type, fd->holes[t].h[g].type))
			return false;
	return true;
}

/* Hole h's per-layer table, declared before the loop: buffers by their first layer's name,
 * integers and messages by their parameter's. */
static const char *print_table(Emit *e, const Fold *fd, int h, int number)
{
	FILE *f = e->f;
	const Hole *x = &fd->holes[0].h[h];
	const char *type = x->type, *table;
	bool pointer = type[strlen(type) - 1] == '*';
	if (!x->label) {
		/* named after the first layer's buffer; a family member's "NAME[3]" as "NAME_3" */
		char *id = arena_printf(e->low->g->arena, "%s_l%d", x->text, number), *o = id;
		for (const char *c = id; *c; c++)
			if (isalnum((unsigned char)*c) || *c == '_')
				*o++ = *c;
			else if (*c == '[')
				*o++ = '_';
		*o = 0;
		table = id;
		fprintf(f, "\t\t%sconst %s[%d] = {", type, table, fd->run->nlayers);
	} else {
		table = arena_printf(e->low->g->arena, "%s_l%d", x->label, number);
		fprintf(f, "\t\tstatic const %s%s%s[%d] = {", type, pointer ? "const " : " ", table, fd->run->nlayers);
	}
	for (int t = 0; t < fd->run->nlayers; t++)
		fprintf(f, "%s%s", t ? ", " : "", fd->holes[t].h[h].text);
	fprintf(f, "};\n");
	return table;
}

/* Where two layers' names of one thing differ ("layers.0.mlp", "layers.1.mlp"): a's text before
 * (pre characters) and after (post) the layer's number; false when they differ in more than a
 * number. */
static bool layer_number_at(const char *a, const char *b, size_t *pre, size_t *post)
{
	size_t la = strlen(a), lb = strlen(b);
	*pre = *post = 0;
	while (*pre < la && *pre < lb && a[*pre] == b[*pre])
		(*pre)++;
	while (*post < la - *pre && *post < lb - *pre && a[la - 1 - *post] == b[lb - 1 - *post])
		(*post)++;
	while (*pre > 0 && isdigit((unsigned char)a[*pre - 1]))
		(*pre)--;
	while (*post > 0 && isdigit((unsigned char)a[la - *post]))
		(*post)--;
	for (size_t i = *pre; i < la - *post; i++)
		if (!isdigit((unsigned char)a[i]))
			return false;
	return la - *pre - *post > 0;
}

/* open, then a's text with the layer's number as '*' ("matmul in layers.*.mlp") where b, the same
 * thing of another layer, differs from it, then close */
static void print_layer_pattern(Emit *e, const char *open, const char *a, const char *b, const char *close)
{
	size_t pre, post;
	if (!strcmp(a, b))
		fprintf(e->f, "%s%s%s", open, a, close);
	else if (layer_number_at(a, b, &pre, &post))
		fprintf(e->f, "%s%.*s*%s%s", open, (int)pre, a, a + strlen(a) - post, close);
	else
		fprintf(e->f, "%s%s (layer by layer)%s", open, a, close);
}

/* A comment that names the layer ("matmul in layers.3.mlp"), with the layer's number as '*' */
static void print_layer_comment(Emit *e, const Fold *fd, int h)
{
	print_layer_pattern(e, " /* ", fd->holes[0].h[h].text, fd->holes[fd->run->nlayers - 1].h[h].text, " */");
}

/* Whether hole h is a transient buffer at offset + l * step in layer l (each layer's saved
 * activations in the slot; step 0: one place every layer, as the arena's scratch buffers are). */
static bool transient_steps(const Fold *fd, int h, long long *step)
{
	*step = fd->cls[h].step;
	return fd->cls[h].kind == LV_PLACE;
}

/* The stage's macro for a transient buffer of each layer, at offset + l * step: named after the
 * loop's first layer's ("x_60_at(l)"), defined once (print_places). */
static const char *place_macro(Emit *e, const Hole *x, long long step)
{
	Arena *a = e->low->g->arena;
	const char *def = arena_printf(a, "(l) ((%s *)(%s + %lld + (int64_t)(l) * %lld))", x->cast, x->place, x->offset, step);
	const char *name = arena_printf(a, "%s_at", x->text);
	for (int n = 1;; n++) {
		const char *had = symtab_get(e->places, name);
		if (!had || !strcmp(had, def))
			break;
		name = arena_printf(a, "%s_at%d", x->text, n);
	}
	if (symtab_get(e->places, name))
		return name;
	symtab_put(e->places, name, (void *)def);
	if (e->nplaces == e->capplaces) {
		e->capplaces = e->capplaces ? 2 * e->capplaces : 64;
		e->place_defs = realloc(e->place_defs, sizeof(char *) * (size_t)e->capplaces);
		if (!e->place_defs)
			ICE("out of memory");
	}
	e->place_defs[e->nplaces++] = arena_printf(a, "#define %s%s\n", name, def);
	return name;
}

/* The stage's macros of transient buffers by layer (before its phase functions). */
static void print_places(Emit *e)
{
	if (e->nplaces)
		fprintf(e->f, "/* transient buffers by layer: a layer's saved activations in the slot */\n");
	for (int i = 0; i < e->nplaces; i++)
		fputs(e->place_defs[i], e->f);
	free(e->place_defs);
	e->place_defs = NULL;
	e->nplaces = e->capplaces = 0;
}

/* Whether hole h is a view of one buffer at the first layer's place + l * step elements (each
 * layer's gradient in a flat bucket): the first layer's pointer plus l strides, no table */
static bool view_steps(const Emit *e, const Fold *fd, int h, long long *step)
{
	if (fd->cls[h].kind != LV_VIEW)
		return false;
	*step = fd->cls[h].step / dtype_bytes(e->p->buf[fd->holes[0].h[h].buf].dtype);
	return true;
}

/* Whether hole h is an integer value + l * step in layer l (a parameter index, a dropout's key) */
static bool integer_steps(const Fold *fd, int h, long long *step)
{
	*step = fd->cls[h].step;
	return fd->cls[h].kind == LV_INT_STEP;
}

/* whether name is a state buffer's name in the stage (with the prefix) or a family's */
static bool stage_name_taken(Emit *e, const char *name)
{
	if (e->layer_array && !strcmp(e->layer_array, name))
		return true;
	for (int i = 0; i < e->nfamilies; i++)
		if (!strcmp(e->families[i].name, name))
			return true;
	size_t np = strlen(e->prefix);
	if (strncmp(name, e->prefix, np))
		return false;
	for (int b = 0; b < e->p->nbuf; b++)
		if (!strcmp(e->p->buf[b].name, name + np))
			return true;
	return false;
}

/* The name of the family of buffers b0 and b1 (two layers' buffers, named a and b in the file):
 * "s0_p_layers_0_block_wq", "s0_p_layers_1_block_wq" -> "s0_p_layers_block_wq", the name without
 * the digits where the two differ; a name that ends in its number ("s0_master_17") takes what the
 * buffer holds instead ("layers.0.block.wq" -> "s0_master_layers_block_wq"). Unique in the stage:
 * else "_by_layer" and a number follow. */
static const char *family_name(Emit *e, int b0, int b1, const char *a, const char *b)
{
	Arena *ar = e->low->g->arena;
	const char *w0 = e->p->buf[b0].what, *w1 = e->p->buf[b1].what;
	size_t la = strlen(a), pre, post;
	const char *name = NULL;
	if (!layer_number_at(a, b, &pre, &post)) {
		name = NULL;
	} else if (post > 0) {
		if (pre > 0 && a[pre - 1] == '_' && a[la - post] == '_')
			pre--;
		name = arena_printf(ar, "%.*s%s", (int)pre, a, a + la - post);
	} else if (w0 && w1 && layer_number_at(w0, w1, &pre, &post)) {
		size_t lw = strlen(w0), stem = la;
		while (stem > 0 && (isdigit((unsigned char)a[stem - 1]) || a[stem - 1] == '_'))
			stem--;
		char *what = arena_printf(ar, "%.*s%s", (int)pre, w0, w0 + lw - post), *o = what;
		for (const char *c = what; *c; c++) /* as an identifier: runs of other characters as one '_' */
			if (isalnum((unsigned char)*c))
				*o++ = *c;
			else if (o > what && o[-1] != '_')
				*o++ = '_';
		while (o > what && o[-1] == '_')
			o--;
		*o = 0;
		name = arena_printf(ar, "%.*s_%s", (int)stem, a, what);
	}
	if (!name)
		return arena_printf(ar, "%s_by_layer%d", a, e->nfamilies);
	if (stage_name_taken(e, name))
		return arena_printf(ar, "%s_by_layer%d", name, e->nfamilies);
	return name;
}

/* The per-layer struct's field for a family named base (without the stage prefix) of members like
 * x, of pointer type type: the field any stage's family of that name and type has, else a new one
 * (base, or base_N where a family of another type has base). */
static const char *layer_field(Emit *e, const char *base, const char *type, const Buffer *x)
{
	bool taken = false;
	for (int i = 0; i < e->nfields; i++) {
		LayerField *fl = &e->fields[i];
		if (!strcmp(fl->base, base) && !strcmp(fl->type, type)) {
			if (fl->elems != x->elems)
				fl->elems = -1; /* stages differ: the comment says none */
			return fl->name;
		}
		taken |= !strcmp(fl->name, base);
	}
	if (e->nfields == e->capfields) {
		e->capfields = e->capfields ? 2 * e->capfields : 32;
		e->fields = realloc(e->fields, sizeof(LayerField) * (size_t)e->capfields);
		if (!e->fields)
			ICE("out of memory");
	}
	const char *name = taken ? arena_printf(e->low->g->arena, "%s_%d", base, e->nfields) : base;
	e->fields[e->nfields++] = (LayerField){.base = base, .name = name, .type = type, .kind = x->state, .elems = x->elems};
	return name;
}

/* Whether hole h names a state buffer of each layer, alike (one kind and size): then the stage's
 * family of them (layer_family: made here, before the families are fixed, if none of them is in one
 * yet) serves every loop that indexes them; *at and *dir say where layer l's is: at + dir * l. */
static const Family *state_family(Emit *e, const Fold *fd, int h, int *at, int *dir)
{
	int n = fd->run->nlayers, had = e->fams.n;
	if (fd->cls[h].kind != LV_STATE)
		return NULL;
	int *bufs = malloc(sizeof(int) * (size_t)n);
	if (!bufs)
		ICE("out of memory");
	for (int t = 0; t < n; t++)
		bufs[t] = fd->holes[t].h[h].buf;
	int f = layer_family(&e->fams, bufs, n, fd->run->step < 0, at, dir);
	free(bufs);
	if (e->fams.n > had) { /* a new family: its name and pointers' type */
		if (e->nfamilies == e->capfamilies) {
			e->capfamilies = e->capfamilies ? 2 * e->capfamilies : 16;
			e->families = realloc(e->families, sizeof(Family) * (size_t)e->capfamilies);
			if (!e->families)
				ICE("out of memory");
		}
		int b0 = fd->holes[0].h[h].buf, b1 = fd->holes[1].h[h].buf;
		const char *name = family_name(e, b0, b1, fd->holes[0].h[h].text, fd->holes[1].h[h].text);
		Family *fam = &e->families[e->nfamilies++];
		*fam = (Family){.name = name, .type = fd->holes[0].h[h].type, .members = e->fams.members[had],
				.n = e->fams.size[had]};
		size_t np = strlen(e->prefix);
		const char *base = strncmp(fam->name, e->prefix, np) ? fam->name : fam->name + np;
		fam->field = layer_field(e, base, fam->type, &e->p->buf[b0]);
	}
	return f >= 0 ? &e->families[f] : NULL;
}

/* The stage's state families, made from its folds' holes before anything of the stage is
 * printed, the longest runs first (so the family of a parameter is every layer the stage holds, and
 * shorter runs index into it); then every member is named by its array's entry, in the holes'
 * texts too. */
static void plan_families(Emit *e)
{
	const char *array = arena_printf(e->low->g->arena, "%slayer", e->prefix);
	e->layer_array = NULL;
	e->layer_array = stage_name_taken(e, array) ? arena_printf(e->low->g->arena, "%slayer_state", e->prefix) : array;
	bool *done = calloc((size_t)e->nfolds + 1, sizeof(bool));
	if (!done)
		ICE("out of memory");
	for (int k = 0; k < e->nfolds; k++) {
		int best = -1;
		for (int i = 0; i < e->nfolds; i++)
			if (!done[i] && (best < 0 || e->folds[i].run->nlayers > e->folds[best].run->nlayers))
				best = i;
		done[best] = true;
		const Fold *fd = &e->folds[best];
		long long step;
		int at, dir;
		for (int h = 0; h < fd->holes[0].n; h++)
			if (fd->holes[0].h[h].type && !hole_same(fd, h) && !transient_steps(fd, h, &step) &&
			    !integer_steps(fd, h, &step))
				state_family(e, fd, h, &at, &dir);
	}
	free(done);
	e->fams.fixed = true;
	for (int i = 0; i < e->nfolds; i++)
		for (int t = 0; t < e->folds[i].run->nlayers; t++)
			for (int h = 0; h < e->folds[i].holes[t].n; h++) {
				Hole *x = &e->folds[i].holes[t].h[h];
				if (x->buf >= 0 && e->family_of[x->buf] >= 0)
					x->text = arena_printf(e->low->g->arena, "%s[%d].%s", e->layer_array, e->family_at[x->buf],
							       e->families[e->family_of[x->buf]].field);
			}
}

static void free_families(Emit *e)
{
	free(e->families);
	e->families = NULL;
	e->nfamilies = e->capfamilies = 0;
	layer_families_free(&e->fams);
	e->family_of = e->family_at = NULL;
}

/* A value hole in the loop's body: its one value, the place of a transient buffer of the layer, a
 * state pointer of the layer from the stage's family table, or its table's entry */
static void print_hole(Emit *e, const Fold *fd, int h, const char *table)
{
	const Hole *x = &fd->holes[0].h[h];
	long long step;
	int at, dir;
	const Family *fam;
	if (table)
		fprintf(e->f, "%s[l]", table);
	else if (!hole_same(fd, h) && transient_steps(fd, h, &step) && step)
		fprintf(e->f, "%s(l)", place_macro(e, x, step));
	else if (!hole_same(fd, h) && integer_steps(fd, h, &step))
		fprintf(e->f, "(%s + %sl * %lld)", x->text, strcmp(x->type, "int") ? "(int64_t)" : "", step);
	else if (view_steps(e, fd, h, &step))
		fprintf(e->f, "(%s + (int64_t)l * %lld)", x->text, step);
	else if (!hole_same(fd, h) && (fam = state_family(e, fd, h, &at, &dir)))
		fprintf(e->f, "%s[%s].%s", e->layer_array,
			at == 0 && dir > 0 ? "l" : arena_printf(e->low->g->arena, "%d %s l", at, dir > 0 ? "+" : "-"), fam->field);
	else
		fputs(x->text, e->f); /* the same in every layer, or the same place under another name */
}

/* ------------------------------------------------------------------ one loop function for the stages */

/* Every stage of a pipeline runs the same layers: its folded runs print alike but for their names
 * (the stage's buffers, families and places) and the integers that number its layers (keys,
 * parameter indices). With several stages the file is printed twice: the first time only to
 * learn which folded runs print the same loop up to what their holes print (a run's "shape":
 * each hole a parameter) and which of those values are the same in every stage that has the
 * shape (a size, a scratch buffer at one place in the arena). The second time a shape that two or
 * more runs have is one function, printed before the first phase that calls it: the loop
 * print_fold prints, what is the same in every stage written in, what differs by stage a
 * parameter (a buffer, a state family from the run's first layer on, the first layer's place in
 * the slot, an integer's first value, a per-layer table). Each call so runs the stage's own
 * unrolled kernels in their order with their arguments. A shape only one run has is printed as
 * the loop in place. */
typedef struct LoopParam {
	const char *type; /* its C type */
	const char *stem; /* its name's stem: buf, layer, at, tab, or the hole's label */
	const char *arg;  /* the stage's argument */
	const char *use;  /* how the body reads it, '@' for its name */
	const char *same; /* what the body reads when every stage's is the same (NULL: never) */
	bool member;      /* the stage's per-layer struct array: the use is followed by the hole's field */
	const char *place_of; /* a place's offset: the buffer it places (its name names the parameter) */
	bool layer_number;    /* the run's first layer: a hole prints its parameter-table entry from it */
} LoopParam;

/* A shape that several folded runs (in several stages) print: which of its parameters differ. */
typedef struct LoopShape {
	int nruns, nparams;
	const char **first; /* [param]: the first run's `same` */
	bool *differs;      /* [param] */
	/* [param]: the first parameter that has its argument in every run of the shape (itself, or one
	 * it folds into: two buffers every stage places alike are one argument) */
	int *same_as;
	const char *fn;     /* its function, once printed */
} LoopShape;

/* Whether hole h is a parameter-table index that steps with the layer's number as the file's
 * PARAM_ enum does (layer L's entry is layer 0's plus L * *per_layer): then *zero is layer 0's
 * enum name, which differs from the hole's only in digits, and a loop shared by stages reads the
 * entry from the stage's first layer (`PARAM_layers_0_mlp_w1 + (first_layer + l) * 16`) instead
 * of taking each entry's first value as a parameter of its own. */
static bool layer_param_entry(Emit *e, const Fold *fd, int h, const char **zero, long long *per_layer)
{
	const Hole *x = &fd->holes[0].h[h];
	long long step;
	if (!x->label || strcmp(x->label, "param") || !x->integer || hole_same(fd, h) || !integer_steps(fd, h, &step) ||
	    (fd->run->step != 1 && fd->run->step != -1)) /* l is then the layer's number less the first's */
		return false;
	long long s = step * fd->run->step, v0 = x->value - (long long)fd->run->first_layer * s;
	if (v0 < 0 || v0 >= e->low->nparams || s == 0)
		return false;
	const char *a = e->param_names[v0], *b = x->text;
	while (*a && *a == *b) /* the names alike but for their layer numbers (the same: layer 0's run) */
		a++, b++;
	if (*a != *b && (!isdigit((unsigned char)*a) || !isdigit((unsigned char)*b)))
		return false;
	while (isdigit((unsigned char)*a))
		a++;
	while (isdigit((unsigned char)*b))
		b++;
	if (strcmp(a, b))
		return false;
	*zero = e->param_names[v0];
	*per_layer = s;
	return true;
}

/* Value hole h of fold fd as a parameter of the shared loop function (print_hole's cases). */
static LoopParam loop_param(Emit *e, const Fold *fd, int h, const char *table)
{
	Arena *a = e->low->g->arena;
	const Hole *x = &fd->holes[0].h[h];
	bool text = !strcmp(x->type, "char *"), pointer = x->type[strlen(x->type) - 1] == '*';
	long long step;
	int at, dir;
	const Family *fam;
	if (table)
		return (LoopParam){text ? "const char *const *" : pointer ? arena_printf(a, "%sconst *", x->type)
									 : arena_printf(a, "const %s *", x->type),
				   "tab", table, "@[l]", NULL, false, NULL, false};
	if (!hole_same(fd, h) && transient_steps(fd, h, &step) && step) {
		const char *off = arena_printf(a, "%lld", x->offset);
		return (LoopParam){"int64_t", "at", off, arena_printf(a, "((%s *)(%s + @ + (int64_t)l * %lld))", x->cast, x->place, step),
				   off, false, x->text, false};
	}
	const char *zero;
	long long per_layer;
	if (!table && layer_param_entry(e, fd, h, &zero, &per_layer)) {
		const char *first = arena_printf(a, "%d", fd->run->first_layer);
		return (LoopParam){"int", "first_layer", first, fd->run->step > 0 ? "(@ + l)" : "(@ - l)", first, false, NULL, true};
	}
	if (!hole_same(fd, h) && integer_steps(fd, h, &step))
		return (LoopParam){x->type, x->label ? x->label : "value", x->text,
				   arena_printf(a, "(@ + %sl * %lld)", strcmp(x->type, "int") ? "(int64_t)" : "", step), x->text, false, NULL, false};
	if (view_steps(e, fd, h, &step))
		return (LoopParam){x->type, "buf", x->text, arena_printf(a, "(@ + (int64_t)l * %lld)", step), NULL, false, NULL, false};
	if (!hole_same(fd, h) && (fam = state_family(e, fd, h, &at, &dir)))
		return (LoopParam){"layer_state_t *", "layer", at ? arena_printf(a, "%s + %d", e->layer_array, at) : e->layer_array,
				   dir > 0 ? "@[l]" : "@[-l]", NULL, true, NULL, false};
	if (x->buf >= 0 && x->place) { /* a transient buffer: the same in two stages where it is at one place */
		const char *off = arena_printf(a, "%lld", x->offset);
		return (LoopParam){"int64_t", "at", off, arena_printf(a, "((%s *)(%s + @))", x->cast, x->place), off, false, x->text, false};
	}
	if (x->buf >= 0)
		return (LoopParam){x->type, "buf", x->text, "@", NULL, false, NULL, false};
	return (LoopParam){text ? "const char *" : x->type, x->label ? x->label : "value", x->text, "@", x->text, false, NULL, false};
}

/* p's use in the body: its name (name, or stem and number j), or its value where every stage's is
 * the same */
static void print_param_use(FILE *f, const LoopParam *p, int j, const char *name, bool inlined)
{
	for (const char *c = p->use; *c; c++)
		if (*c != '@')
			fputc(*c, f);
		else if (inlined)
			fputs(p->same, f);
		else if (name)
			fputs(name, f);
		else
			fprintf(f, "%s%d", p->stem, j);
}

/* Fold fd's value holes as parameters (holes alike in every layer are one), and (*param_of,
 * malloc'd) each hole's. */
/* Whether holes h and g of fold fd name the same buffers layer for layer (both name buffers). Two
 * buffers that the memory plan happens to give one place are not the same: which ones coincide
 * differs between the stages that share a loop function, so it must not shape the function. */
static bool same_buffers(const Fold *fd, int h, int g)
{
	for (int t = 0; t < fd->run->nlayers; t++)
		if (fd->holes[t].h[h].buf != fd->holes[t].h[g].buf)
			return false;
	return true;
}

static LoopParam *loop_params(Emit *e, const Fold *fd, const char **table, int **param_of_out, int *np)
{
	int nh = fd->holes[0].n, *param_of = calloc((size_t)nh + 1, sizeof(int)), *hole_of = calloc((size_t)nh + 1, sizeof(int));
	LoopParam *ps = calloc((size_t)nh + 1, sizeof(LoopParam));
	if (!ps || !param_of || !hole_of)
		ICE("out of memory");
	*param_of_out = param_of;
	*np = 0;
	for (int h = 0; h < nh; h++) {
		if (!fd->holes[0].h[h].type)
			continue;
		LoopParam x = loop_param(e, fd, h, table[h]);
		int j = 0;
		while (j < *np && (strcmp(ps[j].type, x.type) || strcmp(ps[j].stem, x.stem) || strcmp(ps[j].arg, x.arg) ||
				   strcmp(ps[j].use, x.use) ||
				   ((fd->holes[0].h[h].buf >= 0 || fd->holes[0].h[hole_of[j]].buf >= 0) &&
				    !same_buffers(fd, h, hole_of[j]))))
			j++;
		if (j == *np) {
			hole_of[j] = h;
			ps[(*np)++] = x;
		}
		param_of[h] = j;
	}
	free(hole_of);
	return ps;
}

/* The identifier (or number) at c, as the file names it: a loop function's table by the one printed
 * for its nest (loop_alias: a stage's fold was printed before its loop functions were). Returns
 * the character after it. */
static const char *print_identifier(Emit *e, const char *c)
{
	const char *start = c;
	while (isalnum((unsigned char)*c) || *c == '_')
		c++;
	char id[256];
	size_t n = (size_t)(c - start);
	const char *alias = NULL;
	if (!isdigit((unsigned char)*start) && n < sizeof id) {
		memcpy(id, start, n);
		id[n] = 0;
		alias = symtab_get(e->loop_alias, id);
	}
	if (alias)
		fputs(alias, e->f);
	else
		fwrite(start, 1, n, e->f);
	return c;
}

/* Fold fd's loop body with its parameters ps (inlined: those written in), its loops' functions by
 * the names the file printed them under. */
static char *loop_body_text(Emit *e, const Fold *fd, const LoopParam *ps, const int *param_of, const bool *inlined,
			    const char *const *names)
{
	char *body = NULL;
	size_t len = 0;
	FILE *saved = e->f;
	if (!(e->f = open_memstream(&body, &len)))
		ICE("out of memory");
	bool line_start = true;
	int h = 0;
	for (const char *c = fd->text; *c;) {
		if (line_start)
			fputc('\t', e->f);
		line_start = *c == '\n';
		if (*c == HOLE_VALUE) {
			int j = param_of[h];
			const char *zero = NULL;
			long long per_layer = 0;
			if (ps[j].layer_number && layer_param_entry(e, fd, h, &zero, &per_layer)) /* layer 0's entry + */
				fprintf(e->f, "(%s + ", zero);
			print_param_use(e->f, &ps[j], j, names ? names[j] : NULL, inlined && inlined[j]);
			if (zero)
				fprintf(e->f, " * %lld)", per_layer);
			if (ps[j].member) /* the layer's struct: the family's field */
				fprintf(e->f, ".%s", e->families[e->family_of[fd->holes[0].h[h].buf]].field);
			h++;
			c++;
		} else if (*c == HOLE_COMMENT) {
			print_layer_comment(e, fd, h++);
			c++;
		} else if (isalnum((unsigned char)*c) || *c == '_') {
			c = print_identifier(e, c);
		} else {
			fputc(*c++, e->f);
		}
	}
	if (fclose(e->f) != 0)
		ICE("out of memory");
	e->f = saved;
	return body;
}

/* The name a stage's argument suggests for its parameter: the argument's name without its stage
 * prefix (sN_), its index ([N], or _N of a family member) and an added place (" + N"), as in
 * s0_g_layers_mlp_w1 + 1 -> g_layers_mlp_w1. An argument with no stage prefix names something of
 * the whole file (an enumerator such as PARAM_layers_0_mlp_w1), which the parameter must not
 * shadow: one that steps by layer (steps) is its first layer's, PARAM_layers_mlp_w1_first (its
 * first _N part, the layer's number, dropped); any other keeps its positional name. NULL when the
 * name is no identifier. */
static const char *arg_param_name(Arena *a, const char *arg, bool steps)
{
	if (!(arg[0] == 's' && isdigit((unsigned char)arg[1]))) {
		if (!steps || !isalpha((unsigned char)arg[0]) || arg[strspn(arg, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
									"abcdefghijklmnopqrstuvwxyz0123456789_")])
			return NULL;
		char *name = arena_printf(a, "%s_first", arg);
		for (char *c = name; *c; c++) {
			size_t digits = c[0] == '_' ? strspn(c + 1, "0123456789") : 0;
			if (digits && c[1 + digits] == '_') {
				memmove(c, c + 1 + digits, strlen(c + 1 + digits) + 1);
				break;
			}
		}
		return name;
	}
	size_t n = strcspn(arg, " [");
	if (arg[n] == ' ' && strncmp(arg + n, " + ", 3))
		return NULL;
	if (arg[n] == '[' && (arg[n + 1 + strspn(arg + n + 1, "0123456789")] != ']'))
		return NULL;
	size_t k = 1 + strspn(arg + 1, "0123456789"); /* the stage prefix sN_ */
	if (arg[k] == '_' && k + 1 < n) {
		arg += k + 1;
		n -= k + 1;
	}
	size_t digits = 0;
	while (digits < n && isdigit((unsigned char)arg[n - 1 - digits]))
		digits++;
	if (digits && digits + 1 < n && arg[n - 1 - digits] == '_')
		n -= digits + 1;
	if (!n || isdigit((unsigned char)arg[0]))
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)arg[i]) && arg[i] != '_')
			return NULL;
	static const char *const taken[] = {"ctx", "nlayers", "l", "auto", "break", "case", "char", "const",
					    "continue", "default", "do", "double", "else", "enum", "extern", "float",
					    "for", "goto", "if", "inline", "int", "long", "register", "restrict",
					    "return", "short", "signed", "sizeof", "static", "struct", "switch",
					    "typedef", "union", "unsigned", "void", "volatile", "while"};
	for (size_t i = 0; i < sizeof taken / sizeof *taken; i++)
		if (strlen(taken[i]) == n && !strncmp(taken[i], arg, n))
			return NULL;
	return arena_printf(a, "%.*s", (int)n, arg);
}

/* whether the C text mentions identifier id (as a whole word) */
static bool mentions(const char *text, const char *id)
{
	size_t n = strlen(id);
	for (const char *c = strstr(text, id); c; c = strstr(c + 1, id))
		if ((c == text || (!isalnum((unsigned char)c[-1]) && c[-1] != '_')) && !isalnum((unsigned char)c[n]) &&
		    c[n] != '_')
			return true;
	return false;
}

/* The shared function's parameters' names (names[j]; NULL: the positional stem and number): each
 * the name its first caller's argument suggests, unless that is no identifier, is another
 * parameter's (suggested or positional) or is a name the body (with positional names) uses. */
static void loop_param_names(Emit *e, const LoopShape *sh, const LoopParam *ps, const bool *inlined, const char *body,
			     const char **names)
{
	Arena *a = e->low->g->arena;
	for (int j = 0; j < sh->nparams; j++) {
		names[j] = inlined[j] ? NULL : arg_param_name(a, ps[j].arg, strstr(ps[j].use, "l *") != NULL);
		const char *placed = !names[j] && !inlined[j] && ps[j].place_of ? arg_param_name(a, ps[j].place_of, false) : NULL;
		if (placed) /* an offset: named after the buffer its first caller places there */
			names[j] = arena_printf(a, "%s_at", placed);
		else if (!inlined[j] && ps[j].layer_number)
			names[j] = "first_layer";
	}
	bool *clash = calloc((size_t)sh->nparams + 1, sizeof(bool));
	if (!clash)
		ICE("out of memory");
	for (int j = 0; j < sh->nparams; j++) {
		if (!names[j])
			continue;
		clash[j] = mentions(body, names[j]);
		for (int k = 0; k < sh->nparams && !clash[j]; k++)
			clash[j] = k != j && !inlined[k] &&
				   ((names[k] && !strcmp(names[k], names[j])) ||
				    !strcmp(arena_printf(a, "%s%d", ps[k].stem, k), names[j]));
	}
	for (int j = 0; j < sh->nparams; j++)
		if (clash[j])
			names[j] = NULL;
	free(clash);
}

/* The shape's function: the loop over the layers with the parameters that differ by stage, named
 * after what its first caller passes. */
static void print_shared_function(Emit *e, const Fold *fd, LoopShape *sh, const LoopParam *ps, const int *param_of)
{
	FILE *f = e->defs;
	sh->fn = arena_printf(e->low->g->arena, "layers_loop%d", e->nshared_fns++);
	bool *inlined = calloc((size_t)sh->nparams + 1, sizeof(bool));
	const char **names = calloc((size_t)sh->nparams + 1, sizeof(char *));
	if (!inlined || !names)
		ICE("out of memory");
	for (int j = 0; j < sh->nparams; j++) /* (a folded parameter is never used: nothing to declare) */
		inlined[j] = !sh->differs[j] || sh->same_as[j] != j;
	char *positional = loop_body_text(e, fd, ps, param_of, inlined, NULL);
	loop_param_names(e, sh, ps, inlined, positional, names);
	free(positional);
	char *body = loop_body_text(e, fd, ps, param_of, inlined, names);
	fprintf(f, "/* layers %d..%d of stage %d, %d kernels a layer: one loop, called by the %d stages whose layers run it;\n"
		   " * what differs by layer is indexed by l, what differs by stage is an argument */\n",
		fd->run->first_layer, fd->run->first_layer + (fd->run->nlayers - 1) * fd->run->step, e->p->stage, fd->run->body,
		sh->nruns);
	fprintf(f, "static void %s(planrt_ctx_t *ctx, int nlayers", sh->fn);
	for (int j = 0; j < sh->nparams; j++)
		if (!inlined[j])
			fprintf(f, ", %s%s%s", ps[j].type, ps[j].type[strlen(ps[j].type) - 1] == '*' ? "" : " ",
				names[j] ? names[j] : arena_printf(e->low->g->arena, "%s%d", ps[j].stem, j));
	fprintf(f, ")\n{\n\t(void)ctx;\n\tfor (int l = 0; l < nlayers; l++) {\n%s\t}\n}\n\n", body);
	free(body);
	free(names);
	free(inlined);
}

/* Fold fd's shape, with its holes as the parameters ps (loop_params: param_of[hole]): its loop's
 * text with every parameter positional, and each parameter's type, stem and use. */
static const char *shape_key(Emit *e, const Fold *fd, const LoopParam *ps, int np, const int *param_of)
{
	char *body = loop_body_text(e, fd, ps, param_of, NULL, NULL), *key = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&key, &len);
	if (!f)
		ICE("out of memory");
	fprintf(f, "%d\n%s", np, body);
	for (int j = 0; j < np; j++)
		fprintf(f, "\n%s %s %s", ps[j].type, ps[j].stem, ps[j].use);
	if (fclose(f) != 0)
		ICE("out of memory");
	const char *shape = arena_printf(e->low->g->arena, "%s", key);
	free(body);
	free(key);
	return shape;
}

/* Fold fd's loop as a call of its shape's function, when several runs have its shape (the first
 * printing prints the function into e->defs); while the file is printed the second time, only
 * what its parameters are (the first, nothing). false: print the loop in place. */
static bool print_shared_call(Emit *e, const Fold *fd, const char **table)
{
	if (e->learning_places) /* the places' kinds are not known yet: no shape is learned */
		return false;
	Arena *a = e->low->g->arena;
	int np, *param_of;
	LoopParam *ps = loop_params(e, fd, table, &param_of, &np);
	const char *key = shape_key(e, fd, ps, np, param_of);
	LoopShape *sh = symtab_get(e->loop_shapes_seen, key);
	bool called = false;
	if (e->learning_shapes) {
		bool first = !sh;
		if (first) {
			sh = arena_alloc(a, sizeof(LoopShape));
			*sh = (LoopShape){.nparams = np, .first = arena_alloc(a, sizeof(char *) * (size_t)(np + 1)),
					  .differs = arena_alloc(a, sizeof(bool) * (size_t)(np + 1)),
					  .same_as = arena_alloc(a, sizeof(int) * (size_t)(np + 1))};
			for (int j = 0; j < np; j++)
				sh->first[j] = ps[j].same;
			symtab_put(e->loop_shapes_seen, key, sh);
		}
		sh->nruns++;
		for (int j = 0; j < np; j++)
			if (!ps[j].same || !sh->first[j] || strcmp(ps[j].same, sh->first[j]))
				sh->differs[j] = true;
		/* the parameters with equal arguments in every run so far (j's class: the first k in j's
		 * class before this run whose argument equals j's in this run) */
		for (int j = np - 1; j >= 0; j--) {
			int k = 0;
			while (k < j && ((!first && sh->same_as[k] != sh->same_as[j]) || strcmp(ps[k].type, ps[j].type) ||
					 strcmp(ps[k].stem, ps[j].stem) || strcmp(ps[k].use, ps[j].use) ||
					 strcmp(ps[k].arg, ps[j].arg)))
				k++;
			sh->same_as[j] = k;
		}
	} else if (sh && sh->nruns > 1) {
		for (int h = 0; h < fd->holes[0].n; h++) /* a folded parameter's uses are its class's first's */
			if (fd->holes[0].h[h].type)
				param_of[h] = sh->same_as[param_of[h]];
		if (!sh->fn)
			print_shared_function(e, fd, sh, ps, param_of);
		fprintf(e->f, "\t\t%s(ctx, %d", sh->fn, fd->run->nlayers);
		for (int j = 0; j < np; j++)
			if (sh->differs[j] && sh->same_as[j] == j)
				fprintf(e->f, ", %s", ps[j].arg);
		fprintf(e->f, ");\n\t}\n");
		called = true;
	}
	free(ps);
	free(param_of);
	return called;
}

/* Whether hole h prints from a per-layer table (none of print_hole's other cases). */
static bool needs_table(Emit *e, const Fold *fd, int h)
{
	long long step;
	int at, dir;
	return fd->holes[0].h[h].type && !hole_same(fd, h) && !transient_steps(fd, h, &step) && !view_steps(e, fd, h, &step) &&
	       !integer_steps(fd, h, &step) && !state_family(e, fd, h, &at, &dir);
}

/* Whether hole h is a transient buffer's place that another stage's run of the same shape may hold
 * in another way: one place in every layer, a place stepping by layer, or a per-layer table (a
 * pipeline stage's first layer reads the inbox where the first stage's reads the slot). */
static bool place_hole(Emit *e, const Fold *fd, int h)
{
	const Hole *x = &fd->holes[0].h[h];
	long long step;
	int at, dir;
	return x->type && x->buf >= 0 && x->type[strlen(x->type) - 1] == '*' && !view_steps(e, fd, h, &step) &&
	       (hole_same(fd, h) || transient_steps(fd, h, &step) || needs_table(e, fd, h)) &&
	       !state_family(e, fd, h, &at, &dir);
}

/* How each place hole of a run's shape prints in the runs (stages) that have the shape; mixed:
 * not the same way in all of them, so that all print it from a table and share one loop. */
typedef struct PlaceKinds {
	int nholes;
	signed char *kind; /* [hole]: -1 no place, 0 one place, 1 stepping, 2 a table */
	bool *mixed;       /* [hole] */
} PlaceKinds;

/* Fold fd's shape with every place hole a table (what two stages' runs of one shape have alike),
 * and how each place hole prints in this run. */
static const char *place_shape(Emit *e, const Fold *fd, signed char *kind)
{
	Arena *a = e->low->g->arena;
	int nh = fd->holes[0].n;
	const char **table = calloc((size_t)nh + 1, sizeof(char *));
	if (!table)
		ICE("out of memory");
	long long step;
	for (int h = 0; h < nh; h++) {
		bool place = place_hole(e, fd, h);
		kind[h] = !place ? -1 : hole_same(fd, h) ? 0 : transient_steps(fd, h, &step) ? 1 : 2;
		if (!place && !needs_table(e, fd, h))
			continue;
		for (int g = 0; g < h && !table[h]; g++) /* as print_fold shares a table between holes */
			if (table[g] && holes_same(fd, h, g))
				table[h] = table[g];
		if (!table[h])
			table[h] = arena_printf(a, "table%d", h);
	}
	int np, *param_of;
	LoopParam *ps = loop_params(e, fd, table, &param_of, &np);
	const char *shape = shape_key(e, fd, ps, np, param_of);
	free(ps);
	free(param_of);
	free(table);
	return shape;
}

/* The place holes that fd prints from a table although it holds them otherwise, because another
 * run of its shape does not hold them alike (NULL: none): learned in the first printing, used in
 * the later ones. */
static bool *places_as_tables(Emit *e, const Fold *fd)
{
	int nh = fd->holes[0].n;
	signed char *kind = calloc((size_t)nh + 1, 1);
	if (!kind)
		ICE("out of memory");
	const char *shape = place_shape(e, fd, kind);
	PlaceKinds *pk = symtab_get(e->places_seen, shape);
	bool *force = NULL;
	if (e->learning_places) {
		if (!pk) {
			Arena *a = e->low->g->arena;
			pk = arena_alloc(a, sizeof(PlaceKinds));
			*pk = (PlaceKinds){.nholes = nh, .kind = arena_alloc(a, (size_t)nh + 1),
					   .mixed = arena_alloc(a, sizeof(bool) * (size_t)(nh + 1))};
			memcpy(pk->kind, kind, (size_t)nh);
			symtab_put(e->places_seen, shape, pk);
		} else if (pk->nholes == nh) {
			for (int h = 0; h < nh; h++)
				if (kind[h] != pk->kind[h])
					pk->mixed[h] = true;
		}
	} else if (pk && pk->nholes == nh) {
		for (int h = 0; h < nh; h++)
			if (pk->mixed[h] && kind[h] != 2) {
				if (!force && !(force = calloc((size_t)nh + 1, sizeof(bool))))
					ICE("out of memory");
				force[h] = true;
			}
	}
	free(kind);
	return force;
}

/* A folded run: its tables, then the loop over its layers with the first layer's text as the body. */
static void print_fold(Emit *e, const Fold *fd)
{
	FILE *f = e->f;
	const LayerRun *r = fd->run;
	int nh = fd->holes[0].n, ntables = 0;
	const char **table = calloc((size_t)nh + 1, sizeof(char *));
	if (!table)
		ICE("out of memory");
	fprintf(f, "\t{ /* layers %d..%d: one loop, %d kernels a layer; what differs by layer is indexed by l */\n",
		r->first_layer, r->first_layer + (r->nlayers - 1) * r->step, r->body);
	bool *force = e->shared_loops ? places_as_tables(e, fd) : NULL;
	for (int h = 0; h < nh; h++) {
		if (!(force && force[h]) && !needs_table(e, fd, h))
			continue;
		for (int g = 0; g < h && !table[h]; g++)
			if (table[g] && holes_same(fd, h, g))
				table[h] = table[g];
		if (!table[h])
			table[h] = print_table(e, fd, h, ntables++);
	}
	free(force);
	if (e->shared_loops && print_shared_call(e, fd, table)) {
		free(table);
		return;
	}
	fprintf(f, "\t\tfor (int l = 0; l < %d; l++) {\n", r->nlayers);
	bool line_start = true;
	int h = 0;
	for (const char *c = fd->text; *c;) {
		if (line_start)
			fprintf(f, "\t\t");
		line_start = *c == '\n';
		if (*c == HOLE_VALUE) {
			print_hole(e, fd, h, table[h]);
			h++;
			c++;
		} else if (*c == HOLE_COMMENT) {
			print_layer_comment(e, fd, h++);
			c++;
		} else if (isalnum((unsigned char)*c) || *c == '_') {
			c = print_identifier(e, c);
		} else {
			fputc(*c++, f);
		}
	}
	fprintf(f, "\t\t}\n\t}\n");
	free(table);
}

/* ------------------------------------------------------------------ one stage */

/* Fused loop k's function; with layers as loops, a loop nest the file already has (the same text
 * up to its name and its arguments' names: every stage of a pipeline runs its layers' loops) is
 * not printed again: its name is an alias of the first one's (loop_alias), which its calls print. */
static void print_loop_function_once(Emit *e, const Kernel *k)
{
	if (!e->layer_loops) {
		print_loop_function(e, k);
		return;
	}
	char *shape = loop_function_shape(e, k);
	const char *had = symtab_get(e->loop_shapes, shape);
	const char *own = arena_printf(e->low->g->arena, "%sloop%d", e->prefix, (int)(k - e->p->k));
	symtab_put(e->loop_alias, arena_printf(e->low->g->arena, "%s_at", own),
		   arena_printf(e->low->g->arena, "%s_at", had ? had : own));
	if (had) { /* its calls name the first one's (print_loop_call, print_identifier) */
		free(shape);
		return;
	}
	symtab_put(e->loop_shapes, arena_strdup(e->low->g->arena, shape), (void *)own);
	free(shape);
	print_loop_function(e, k);
}

/* The per-layer struct shared by the stages (several stages' loops are one function): a field a
 * family of any stage, printed before the first stage. */
static void print_layer_struct(Emit *e)
{
	FILE *f = e->f;
	fprintf(f, "/* a layer's state: one pointer a state family (a parameter, its gradient, optimizer state or\n"
		   " * master weight in each layer of a run); a stage's array of them, sN_layer, is indexed by the\n"
		   " * layer, and planrt_main allocates each member */\n");
	fprintf(f, "typedef struct layer_state {\n");
	for (int i = 0; i < e->nfields; i++) {
		const LayerField *fl = &e->fields[i];
		fprintf(f, "\t%s%s; /* %s", fl->type, fl->name, state_kind_names[fl->kind]);
		if (fl->elems >= 0)
			fprintf(f, ", %lld elements", fl->elems);
		fprintf(f, " */\n");
	}
	fprintf(f, "} layer_state_t;\n\n");
}

/* The per-layer struct of the stage's own families (one stage, or a target without shared loops:
 * the stages' families are not known before the first is printed). */
static void print_stage_layer_struct(Emit *e)
{
	FILE *f = e->f;
	const LProg *p = e->p;
	fprintf(f, "typedef struct { /* a layer's state families: one pointer a family */\n");
	for (int i = 0; i < e->nfamilies; i++) {
		const Family *fam = &e->families[i];
		const Buffer *x = &p->buf[fam->members[0]];
		fprintf(f, "\t%s%s; /* %s, %lld elements each", fam->type, fam->field, state_kind_names[x->state], x->elems);
		if (x->what && p->buf[fam->members[fam->n - 1]].what)
			print_layer_pattern(e, ": ", x->what, p->buf[fam->members[fam->n - 1]].what, " */\n");
		else
			fprintf(f, "%s%s */\n", x->what ? ": " : "", x->what ? x->what : "");
	}
	fprintf(f, "} %s;\n", e->layer_type);
}

/* The stage's per-layer array of its state families' pointers: of the file's struct, or (one stage,
 * or a target without shared loops) of a struct of the stage's own families. */
static void print_layer_array(Emit *e)
{
	FILE *f = e->f;
	if (!e->nfamilies)
		return;
	int most = 0;
	for (int i = 0; i < e->nfamilies; i++)
		if (e->families[i].n > most)
			most = e->families[i].n;
	e->stage_layers[e->stage_index] = e->layer_array;
	e->layer_type = "layer_state_t";
	if (!e->shared_loops) {
		e->layer_type = arena_printf(e->low->g->arena, "%slayer_state_t", e->prefix);
		print_stage_layer_struct(e);
	}
	fprintf(f, "static %s %s[%d]; /* one a layer: its state families' pointers */\n", e->layer_type, e->layer_array, most);
}

/* The stage's buffers; views and transient buffers only where named says the phases name them
 * (NULL: all). */
static void print_buffers(Emit *e, const bool *named)
{
	FILE *f = e->f;
	const LProg *p = e->p;
	fprintf(f, "/* persistent state (allocated by planrt_main) */\n");
	print_layer_array(e);
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls != BUF_STATE || e->family_of[b] >= 0)
			continue;
		fprintf(f, "static %s *", ctype(x->dtype));
		name(e, b);
		fprintf(f, "; /* %s, %lld elements%s%s */\n", state_kind_names[x->state], x->elems, x->what ? ": " : "",
			x->what ? x->what : "");
	}
	fprintf(f, "/* views: buffers that are memory of another from an offset */\n");
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls != BUF_VIEW || (named && !named[b]))
			continue;
		fprintf(f, "#define ");
		name(e, b);
		fprintf(f, " (");
		name(e, x->view_of);
		fprintf(f, " + ");
		if (x->view_axis == VIEW_SLOT)
			fprintf(f, "(%lld + ctx->slot_index * %lld)", x->view_off, x->view_stride);
		else
			coord_expr(e, x->view_off, x->view_axis, x->view_stride);
		fprintf(f, ")\n");
	}
	fprintf(f, "/* transient buffers: the arena (each phase call), a slot (a micro-batch's forward to its\n"
		   " * backward) or an inbox (its inputs, received one action ahead) */\n");
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		const char *base = transient_place(x);
		if (!base || x->first < 0 || (named && !named[b]))
			continue;
		fprintf(f, "#define ");
		name(e, b);
		fprintf(f, " ((%s *)(%s + %zu))\n", ctype(x->dtype), base, x->offset);
	}
	for (int h = 0; h < p->nhandles; h++)
		fprintf(f, "static %s %s%s;\n", p->handles[h].type == HANDLE_BUCKET ? "planrt_bucket_t" : "planrt_request_t",
			e->prefix, p->handles[h].name);
	if (e->target)
		e->target->stage_decls(e);
	fprintf(f, "\n");
}

static bool has_phase(const LProg *p, Phase ph, int chunk)
{
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].phase == ph && p->k[i].chunk == chunk)
			return true;
	return false;
}

static void print_phase(Emit *e, Phase ph, int chunk, bool per_chunk)
{
	FILE *f = e->f, *saved = e->f;
	const LProg *p = e->p;
	for (int i = 0; i < p->nk && e->loop_functions; i++) /* a folded run's first layer's */
		if (p->k[i].kind == K_LOOP && p->k[i].phase == ph && (!per_chunk || p->k[i].chunk == chunk) &&
		    (e->fold_of[i] < 0 || e->fold_pos[i] < e->folds[e->fold_of[i]].run->body))
			print_loop_function_once(e, &p->k[i]);
	char *text = NULL, *defs = NULL;
	size_t len = 0, dlen = 0;
	if (e->shared_loops && (!(f = e->f = open_memstream(&text, &len)) || !(e->defs = open_memstream(&defs, &dlen))))
		ICE("out of memory");
	if (per_chunk)
		fprintf(f, "static void %s%s_c%d(planrt_ctx_t *ctx)\n{\n", e->prefix, phase_names[ph], chunk);
	else
		fprintf(f, "static void %s%s(planrt_ctx_t *ctx)\n{\n", e->prefix, phase_names[ph]);
	fprintf(f, "\t(void)ctx;\n");
	if (e->target)
		e->target->phase_begin(e, ph, chunk);
	for (int i = 0; i < p->nk; i++) {
		if (p->k[i].phase != ph || (per_chunk && p->k[i].chunk != chunk))
			continue;
		if (e->fold_of[i] < 0)
			print_kernel(e, &p->k[i]);
		else if (e->fold_pos[i] == 0)
			print_fold(e, &e->folds[e->fold_of[i]]);
	}
	if (e->target)
		e->target->phase_end(e, ph, chunk);
	fprintf(f, "}\n\n");
	if (e->shared_loops) { /* the shared loop functions it calls first */
		if (fclose(e->f) != 0 || fclose(e->defs) != 0)
			ICE("out of memory");
		e->f = saved;
		e->defs = NULL;
		fputs(defs, e->f);
		fputs(text, e->f);
		free(defs);
		free(text);
	}
}

/* The stage's phase functions, in the order planrt's tables list them. */
static void print_phases(Emit *e)
{
	const LProg *p = e->p;
	print_phase(e, PH_INIT, 0, false);
	print_phase(e, PH_STEP_BEGIN, 0, false);
	for (int c = 0; c < p->nchunks; c++) {
		if (has_phase(p, PH_PREPARE_F, c))
			print_phase(e, PH_PREPARE_F, c, true);
		print_phase(e, PH_FORWARD, c, true);
		if (has_phase(p, PH_PREPARE_B, c))
			print_phase(e, PH_PREPARE_B, c, true);
		print_phase(e, PH_BACKWARD, c, true);
	}
	print_phase(e, PH_STEP, 0, false);
	print_phase(e, PH_SAVE, 0, false);
	for (Phase ph = PH_CHECKPOINT; ph <= PH_EVAL_END; ph++)
		if (has_phase(p, ph, 0))
			print_phase(e, ph, 0, false);
}

/* [buffer]: whether the phases' text names it, or names a view of it */
static bool *named_buffers(Emit *e, const char *text)
{
	Arena *a = e->low->g->arena;
	const LProg *p = e->p;
	SymTab *names = symtab_new(a);
	for (const char *c = text; *c;) {
		if (!isalpha((unsigned char)*c) && *c != '_') {
			c++;
			continue;
		}
		const char *start = c;
		while (isalnum((unsigned char)*c) || *c == '_')
			c++;
		char *id = arena_alloc(a, (size_t)(c - start) + 1);
		memcpy(id, start, (size_t)(c - start));
		symtab_put(names, id, id);
	}
	bool *named = arena_alloc(a, sizeof(bool) * (size_t)(p->nbuf + 1));
	for (int b = p->nbuf - 1; b >= 0; b--) /* a view is of an earlier buffer */
		if (named[b] || symtab_get(names, arena_printf(a, "%s%s", e->prefix, p->buf[b].name)))
			for (int v = b; v >= 0; v = p->buf[v].cls == BUF_VIEW ? p->buf[v].view_of : -1)
				named[v] = true;
	return named;
}

/* The stage's table of its state families (planrt_state_family_t), after its state table: one
 * entry a family, its array of count pointers. */
static void print_family_table(Emit *e)
{
	FILE *f = e->f;
	e->nfamily_entries[e->stage_index] = e->nfamilies;
	if (!e->nfamilies)
		return;
	if (!e->family_macro) {
		fprintf(f, "/* a state family's entry: the field of the stage's per-layer array (planrt_stage_t.layers),\n"
			   " * n layers */\n"
			   "#define LAYER_FAMILY(type, field, kind, bytes, n) \\\n"
			   "\t{#field, kind, bytes, NULL, n, (int)(sizeof(type) / sizeof(void *)), offsetof(type, field)}\n");
		e->family_macro = true;
	}
	char *text = NULL;
	size_t len = 0;
	FILE *t = open_memstream(&text, &len);
	if (!t)
		ICE("out of memory");
	for (int i = 0; i < e->nfamilies; i++) {
		const Family *fam = &e->families[i];
		const Buffer *x = &e->p->buf[fam->members[0]];
		fprintf(t, "\tLAYER_FAMILY(%s, %s, %s, %zu, %d),\n", e->layer_type, fam->field, planrt_state_kind_name(x->state),
			x->bytes, fam->n);
	}
	if (fclose(t) != 0)
		ICE("out of memory");
	for (int i = 0; i < e->nfamily_tables; i++)
		if (!strcmp(e->family_texts[i], text)) { /* an earlier stage's families are alike */
			e->family_table[e->stage_index] = e->family_names[i];
			free(text);
			return;
		}
	Arena *a = e->low->g->arena;
	const char *name = arena_printf(a, "%sfamilies", e->prefix);
	fprintf(f, "static const planrt_state_family_t %s[] = {\n%s};\n\n", name, text);
	e->family_texts[e->nfamily_tables] = arena_printf(a, "%s", text);
	e->family_names[e->nfamily_tables++] = name;
	e->family_table[e->stage_index] = name;
	free(text);
}

static void print_stage(Emit *e)
{
	FILE *f = e->f;
	const LProg *p = e->p;
	plan_folds(e);
	plan_families(e);
	if (e->shared_loops && e->stage_index == 0 && e->nfields)
		print_layer_struct(e);
	fprintf(f, "/* ================================================================ stage %d */\n\n", p->stage);
	if (!e->nfolds) {
		print_buffers(e, NULL);
		print_phases(e);
	} else { /* the phases first: the buffers only the folded layers named are not declared */
		char *text = NULL;
		size_t len = 0;
		if (!(e->f = open_memstream(&text, &len)))
			ICE("out of memory");
		print_phases(e);
		if (fclose(e->f) != 0)
			ICE("out of memory");
		e->f = f;
		print_buffers(e, named_buffers(e, text));
		print_places(e);
		fputs(text, f);
		free(text);
	}
	/* the schedule */
	fprintf(f, "/* one step: F / B (chunk, activation slot, receive inbox, micro-batch) */\n");
	fprintf(f, "static const planrt_action_t %sactions[] = {\n", e->prefix);
	for (int i = 0; i < p->nactions; i++) {
		const SlotAction *a = &p->actions[i];
		fprintf(f, "\t%s(%d, %d, %s, %d),\n", planrt_action_row_name(a->kind), a->chunk, a->slot,
			a->inbox >= 0 ? arena_printf(p->g->arena, "%d", a->inbox) : "PLANRT_NO_INBOX", a->micro);
	}
	fprintf(f, "};\n");
	static const char *const tables[] = {"forward", "backward", "prepare_forward", "prepare_backward"};
	static const Phase phases[] = {PH_FORWARD, PH_BACKWARD, PH_PREPARE_F, PH_PREPARE_B};
	for (int t = 0; t < 4; t++) {
		fprintf(f, "static const planrt_phase_fn %s%s[] = {", e->prefix, tables[t]);
		for (int c = 0; c < p->nchunks; c++) {
			bool exists = t < 2 || has_phase(p, phases[t], c);
			if (exists)
				fprintf(f, "%s%s%s_c%d", c ? ", " : "", e->prefix, phase_names[phases[t]], c);
			else
				fprintf(f, "%sNULL", c ? ", " : "");
		}
		fprintf(f, "};\n");
	}
	fprintf(f, "static const planrt_state_buf_t %sstate[] = {\n", e->prefix);
	int nstate = 0;
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		const Family *fam = e->family_of[b] >= 0 ? &e->families[e->family_of[b]] : NULL;
		if (x->cls != BUF_STATE || (fam && e->family_at[b] > 0))
			continue;
		if (fam)
			continue;
		fprintf(f, "\t{\"%s\", %s, %zu, (void **)&", x->name, planrt_state_kind_name(x->state), x->bytes);
		name(e, b);
		fprintf(f, "},\n");
		nstate++;
	}
	if (!nstate)
		fprintf(f, "\t{\"none\", planrt_state_buffer, 0, NULL},\n");
	fprintf(f, "};\n\n");
	e->nstate_entries[e->stage_index] = nstate;
	print_family_table(e);
	free_folds(e);
	free_families(e);
}

/* the name of a mesh axis, or PLANRT_NO_AXIS */
static const char *axis_or_none(const Emit *e, int a)
{
	return a < 0 ? "PLANRT_NO_AXIS" : arena_printf(e->low->g->arena, "AXIS_%s", e->low->ps->axes[a].name);
}

/* The stage's entry of the stage table (planrt_stage_t), field by field. */
static void print_stage_entry(Emit *e)
{
	FILE *f = e->f;
	const LProg *p = e->p;
	int nstate = e->nstate_entries[e->stage_index];
	const char *x = e->prefix;
	fprintf(f, "\t{\n\t\t.init = %sinit,\n\t\t.step_begin = %sstep_begin,\n\t\t.step_end = %sstep,\n\t\t.save = %ssave,\n",
		x, x, x, x);
	fprintf(f, "\t\t.nchunks = %d,\n\t\t.forward = %sforward,\n\t\t.backward = %sbackward,\n", p->nchunks, x, x);
	fprintf(f, "\t\t.prepare_forward = %sprepare_forward,\n\t\t.prepare_backward = %sprepare_backward,\n", x, x);
	fprintf(f, "\t\t.actions = %sactions,\n\t\t.nactions = %d,\n", x, p->nactions);
	fprintf(f, "\t\t.arena_bytes = %zu,\n\t\t.slot_offset = %zu,\n\t\t.slot_bytes = %zu,\n", p->arena_bytes,
		p->slot_offset, p->slot_bytes);
	fprintf(f, "\t\t.inbox_offset = %zu,\n\t\t.inbox_bytes = %zu,\n", p->inbox_offset, p->inbox_bytes);
	fprintf(f, "\t\t.nslots = %d,\n\t\t.ninbox = %d,\n\t\t.nreqs = %d,\n", p->nslots, p->ninbox, p->nslotreqs);
	fprintf(f, "\t\t.state = %sstate,\n\t\t.nstate = %d,\n", x, nstate);
	if (e->nfamily_entries[e->stage_index])
		fprintf(f, "\t\t.families = %s,\n\t\t.nfamilies = %d,\n\t\t.layers = %s,\n", e->family_table[e->stage_index],
			e->nfamily_entries[e->stage_index], e->stage_layers[e->stage_index]);
	int loss = p->loss_history >= 0 ? p->loss_history : p->loss_metric;
	fprintf(f, "\t\t.loss = &%s%s,\n\t\t.grad_norm = &%s%s,\n", x, p->buf[loss].name, x, p->buf[p->norm_metric].name);
	if (p->loss_window)
		fprintf(f, "\t\t.loss_window = %d,\n", p->loss_window);
	if (p->versions_metric >= 0)
		fprintf(f, "\t\t.versions = &%s%s,\n\t\t.nversions = %lld,\n", x, p->buf[p->versions_metric].name,
			p->buf[p->versions_metric].elems);
	static const char *const fields[] = {[PH_CHECKPOINT] = "checkpoint", [PH_RESUME] = "resume",
					     [PH_EVAL_BEGIN] = "eval_begin", [PH_EVAL_END] = "eval_end"};
	for (Phase ph = PH_CHECKPOINT; ph <= PH_EVAL_END; ph++)
		if (has_phase(p, ph, 0))
			fprintf(f, "\t\t.%s = %s%s,\n", fields[ph], x, phase_names[ph]);
	fprintf(f, "\t\t.eval_loss = &%s%s,\n", x, p->buf[p->loss_metric].name);
	if (p->accuracy_metric >= 0)
		fprintf(f, "\t\t.eval_accuracy = &%s%s,\n", x, p->buf[p->accuracy_metric].name);
	fprintf(f, "\t},\n");
}

/* ------------------------------------------------------------------ the program */

/* PARAM_<the parameter's name as an identifier> for each entry of the parameter table; a name
 * taken already (a tied parameter's copy on another stage) gets its stage, then its index. */
static const char **param_enum_names(const Lowered *low)
{
	Arena *a = low->g->arena;
	const char **names = arena_alloc(a, sizeof(char *) * (size_t)(low->nparams ? low->nparams : 1));
	SymTab *taken = symtab_new(a);
	for (int i = 0; i < low->nparams; i++) {
		char *id = arena_printf(a, "PARAM_%s", low->params[i].name);
		for (char *c = id; *c; c++)
			if (!isalnum((unsigned char)*c) && *c != '_')
				*c = '_';
		if (symtab_get(taken, id))
			id = arena_printf(a, "%s_s%d", id, low->params[i].stage);
		if (symtab_get(taken, id))
			id = arena_printf(a, "%s_%d", id, i);
		symtab_put(taken, id, (void *)names);
		names[i] = id;
	}
	return names;
}

static const char **param_layer_macros(Emit *e, int **layers);
static void print_param_enum(Emit *e);

static void print_prelude(Emit *e, const char *source_path)
{
	FILE *f = e->f;
	const PlanSpec *ps = e->low->ps;
	fprintf(f, "/* prog.c: generated by planc %s from %s, plan %s for model %s. Do not edit.\n", PLANC_VERSION,
		source_path, ps->plan->name, ps->model->name);
	fprintf(f, " * run: mpirun -np %d ./prog --steps K --data FILE [--init W.safetensors] [--save OUT.safetensors]\n",
		ps->world);
	fprintf(f, " *      [--log run.jsonl] [--seed S]; ./prog --help */\n");
	fprintf(f, "#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n");
	fprintf(f, "#include \"planrt.h\"\n#include \"planrt_cpu.h\"\n#include \"planrt_exec.h\"\n#include \"planrt_kernels.h\"\n"
		   "#include \"planrt_math.h\"\n#include \"planrt_program.h\"\n\n");
	if (e->target)
		e->target->prelude(e);
	fprintf(f, "enum { MICRO_BATCHES = %d };\n", ps->micro_batches > 0 ? ps->micro_batches : 1);
	if (ps->naxes == 0) { /* a plan without a mesh: one rank (C has no empty enum or array) */
		fprintf(f, "/* mesh axes: none, one rank */\nstatic const int axis_sizes[1] = {0};\n"
			   "static const char *const axis_names[1] = {\"\"};\n");
	} else {
		fprintf(f, "/* mesh axes */\nenum {");
		for (int a = 0; a < ps->naxes; a++)
			fprintf(f, "%s AXIS_%s = %d", a ? "," : "", ps->axes[a].name, a);
		fprintf(f, " };\n");
		fprintf(f, "static const int axis_sizes[] = {");
		for (int a = 0; a < ps->naxes; a++)
			fprintf(f, "%s%d", a ? ", " : "", ps->axes[a].size);
		fprintf(f, "};\nstatic const char *const axis_names[] = {");
		for (int a = 0; a < ps->naxes; a++)
			fprintf(f, "%s\"%s\"", a ? ", " : "", ps->axes[a].name);
		fprintf(f, "};\n");
	}
	{ /* the layers' parameter macros (printed before the table) */
		char *defs = NULL;
		size_t len = 0;
		FILE *saved = e->f;
		if (!(e->f = open_memstream(&defs, &len)))
			ICE("out of memory");
		e->param_macros = param_layer_macros(e, &e->param_layers);
		if (fclose(e->f) != 0)
			ICE("out of memory");
		e->f = saved;
		e->param_macro_defs = defs;
	}
	print_param_enum(e);
	fprintf(f,
		"/* element-wise helpers of the fused loops */\n"
		"static inline float relu(float x) { return x > 0 ? x : 0; }\n"
		"static inline float relu_grad(float y, float dy) { return y > 0 ? dy : 0; }\n"
		"static inline float gelu_erf(float x) { return planrt_gelu_erf(x); }\n"
		"static inline float gelu_erf_grad(float x, float dy) { return planrt_gelu_erf_grad(x, dy); }\n"
		"static inline float gelu_tanh(float x)\n{\n"
		"\treturn 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n}\n"
		"static inline float gelu_tanh_grad(float x, float dy)\n{\n"
		"\tfloat u = 0.79788456080286536f * (x + 0.044715f * x * x * x), t = tanhf(u);\n"
		"\tfloat du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n"
		"\treturn dy * (0.5f + 0.5f * t + 0.5f * x * (1.0f - t * t) * du);\n}\n"
		"static inline float silu(float x) { return planrt_silu(x); }\n"
		"static inline float silu_grad(float x, float dy) { return planrt_silu_grad(x, dy); }\n"
		"static inline float dropout_grad(uint8_t keep, float dy, float scale) { return keep ? dy * scale : 0; }\n"
		"/* bf16 storage: widen to f32 for arithmetic, round to nearest even when stored */\n"
		"static inline float bf(uint16_t x)\n{\n\tuint32_t u = (uint32_t)x << 16;\n\tfloat f;\n\tmemcpy(&f, &u, 4);\n\treturn f;\n}\n"
		"static inline uint16_t tobf(float f)\n{\n\tuint32_t u;\n\tmemcpy(&u, &f, 4);\n"
		"\tif ((u & 0x7fffffffu) > 0x7f800000u)\n\t\treturn (uint16_t)((u >> 16) | 0x40);\n"
		"\treturn (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);\n}\n"
		"/* f16 storage: IEEE half, widened exactly, rounded to nearest even when stored (planrt_cast's) */\n"
		"static inline float hf(uint16_t x) { return planrt_f16_to_f32(x); }\n"
		"static inline uint16_t tohf(float f) { return planrt_f32_to_f16(f); }\n\n");
	/* only the helpers a file uses must exist: mark the rest used */
	fprintf(f, "static void unused_helpers(void)\n{\n\t(void)relu; (void)relu_grad; (void)gelu_erf; (void)gelu_erf_grad;"
		   " (void)gelu_tanh;\n\t(void)gelu_tanh_grad; (void)silu; (void)silu_grad; (void)dropout_grad; (void)bf;"
		   " (void)tobf;\n\t(void)hf; (void)tohf;\n}\n\n");
}

static void print_dims(FILE *f, const long long *d, int n)
{
	fprintf(f, "{");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%lld", i ? ", " : "", d[i]);
	fprintf(f, "}");
}

/* A parameter's entry (planrt_param_t) as a C value {.name = name, ...}; name is C text. */
static void print_param_value(Emit *e, const ParamEntry *pe, const char *name)
{
	FILE *f = e->f;
	fprintf(f, "{.name = %s, .rank = %d, .gdims = ", name, pe->rank);
	print_dims(f, pe->gdims, pe->rank);
	fprintf(f, ", .ldims = ");
	print_dims(f, pe->ldims, pe->rank);
	fprintf(f, ",\n\t\t.split_axis = {");
	for (int d = 0; d < pe->rank; d++)
		fprintf(f, "%s%s", d ? ", " : "", axis_or_none(e, pe->split_axis[d]));
	fprintf(f, "}, .init_kind = %s, .saved = %d, .a = ", planrt_init_kind_name(pe->init_kind), pe->saved);
	print_double(f, pe->init_a);
	fprintf(f, ", .b = ");
	print_double(f, pe->init_b);
	fprintf(f, "}");
}

/* The parameter table's entry i, named by its PARAM_ enum: its value, or (layer_macro) the macro
 * of its entry in every layer, called with its layer. */
static void print_param_entry(Emit *e, const ParamEntry *pe, int i, const char *layer_macro, int layer)
{
	fprintf(e->f, "\t[%s] = ", e->param_names[i]);
	if (layer_macro)
		fprintf(e->f, "%s(%d)", layer_macro, layer);
	else
		print_param_value(e, pe, arena_printf(e->low->g->arena, "\"%s\"", pe->name));
	fprintf(e->f, ",\n");
}

/* Where parameter i's name holds its layer's number, as one run of digits between non-digits
 * ("layers.12.mlp.w1"): *at and *len; false for a parameter outside the layers. */
static bool param_layer_digits(const Emit *e, int i, int *layer, size_t *at, size_t *len)
{
	const ParamEntry *pe = &e->low->params[i];
	*layer = pe->value >= 0 ? e->low->g->vals[pe->value].layer : -1;
	if (*layer < 0)
		return false;
	const char *digits = arena_printf(e->low->g->arena, "%d", *layer);
	for (const char *c = strstr(pe->name, digits); c; c = strstr(c + 1, digits)) {
		*at = (size_t)(c - pe->name);
		*len = strlen(digits);
		if ((*at == 0 || !isdigit((unsigned char)c[-1])) && !isdigit((unsigned char)c[*len]))
			return true;
	}
	return false;
}

/* With layers as loops, a layer's parameter table entries differ only by the layer's number in
 * their names: each such entry is printed once, as a macro of the layer (its name built by the
 * preprocessor, "layers." #l ".mlp.w1"), defined before the table when two or more entries call
 * it. macros[i] is the macro entry i calls, or NULL. */
static const char **param_layer_macros(Emit *e, int **layers)
{
	const Lowered *low = e->low;
	Arena *a = low->g->arena;
	const char **macros = arena_alloc(a, sizeof(char *) * (size_t)(low->nparams + 1));
	const char **bodies = arena_alloc(a, sizeof(char *) * (size_t)(low->nparams + 1));
	*layers = arena_alloc(a, sizeof(int) * (size_t)(low->nparams + 1));
	if (!e->layer_loops)
		return macros;
	SymTab *by_body = symtab_new(a), *uses = symtab_new(a), *names = symtab_new(a);
	FILE *saved = e->f;
	for (int i = 0; i < low->nparams; i++) {
		const ParamEntry *pe = &low->params[i];
		size_t at, len;
		const char *id = e->param_names[i], *num;
		if (!param_layer_digits(e, i, &(*layers)[i], &at, &len) ||
		    !(num = strstr(id, arena_printf(a, "_%d", (*layers)[i]))))
			continue;
		const char *name = arena_printf(a, "%s%.*s\" #l \"%s\"", at ? "\"" : "", (int)at, pe->name, pe->name + at + len);
		if (!at)
			name = arena_printf(a, "#l \"%s\"", pe->name + len);
		char *body = NULL;
		size_t blen = 0;
		if (!(e->f = open_memstream(&body, &blen)))
			ICE("out of memory");
		print_param_value(e, pe, name);
		if (fclose(e->f) != 0)
			ICE("out of memory");
		e->f = saved;
		char *one = arena_strdup(a, body), *o = one; /* on one line: a macro's */
		for (const char *c = body; *c; c++)
			if (*c == '\n') {
				*o++ = ' ';
				c += strspn(c + 1, "\t");
			} else
				*o++ = *c;
		*o = 0;
		bodies[i] = one;
		free(body);
		const char *macro = symtab_get(by_body, bodies[i]);
		if (!macro) { /* PARAM_layers_3_mlp_w1 -> LAYER_PARAM_layers_mlp_w1 */
			macro = arena_printf(a, "LAYER_%.*s%s", (int)(num - id), id, num + strlen(arena_printf(a, "_%d", (*layers)[i])));
			while (symtab_get(names, macro))
				macro = arena_printf(a, "%s_", macro);
			symtab_put(names, macro, (void *)macro);
			symtab_put(by_body, bodies[i], (void *)macro);
		}
		macros[i] = macro;
		symtab_put(uses, macro, (void *)(intptr_t)((intptr_t)symtab_get(uses, macro) + 1));
	}
	bool any = false;
	for (int i = 0; i < low->nparams; i++) {
		if (macros[i] && (intptr_t)symtab_get(uses, macros[i]) < 2)
			macros[i] = NULL;
		else if (macros[i] && symtab_get(names, macros[i])) { /* the first entry defines it */
			if (!any)
				fprintf(e->f, "/* a layer's parameter: the same entry in every layer but for the number in its name */\n");
			any = true;
			fprintf(e->f, "#define %s(l) %s\n", macros[i], bodies[i]);
			symtab_put(names, macros[i], NULL);
		}
	}
	if (any)
		fprintf(e->f, "\n");
	return macros;
}

/* Parameter i's PARAM_ name with its layer's number as the preprocessor pastes it
 * ("PARAM_layers_ ## l ## _mlp_w1"), or NULL where the name does not hold the number. */
static const char *param_name_pattern(const Emit *e, int i)
{
	const char *id = e->param_names[i], *digits = arena_printf(e->low->g->arena, "_%d", e->param_layers[i]);
	size_t n = strlen(digits);
	for (const char *c = strstr(id, digits); c; c = strstr(c + 1, digits))
		if (!isdigit((unsigned char)c[n]))
			return c[n] ? arena_printf(e->low->g->arena, "%.*s ## l ## %s", (int)(c + 1 - id), id, c + n)
				    : arena_printf(e->low->g->arena, "%.*s ## l", (int)(c + 1 - id), id);
	return NULL;
}

/* Each layer's parameters are adjacent in the table and alike but for the layer's number: a run of
 * a layer's entries that every entry prints by its layer macro is a *block*, and a block that two
 * or more layers have (the same macros, the same names) is printed as one macro of the layer in
 * the PARAM_ enum (LAYER_PARAM_NAMES(7)) and one in the table (LAYER_PARAM_ENTRIES(7)). */
static void param_layer_blocks(Emit *e)
{
	const Lowered *low = e->low;
	Arena *a = low->g->arena;
	int n = low->nparams;
	e->param_block = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
	e->param_block_len = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
	e->block_names = arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
	e->block_entries = arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
	const char **shape = arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
	SymTab *count = symtab_new(a), *kind = symtab_new(a);
	for (int i = 0; i < n; i++)
		e->param_block[i] = -1;
	if (e->target) /* the C target's (the CUDA host program prints each entry) */
		return;
	e->param_patterns = arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		e->param_patterns[i] = e->param_macros[i] ? param_name_pattern(e, i) : NULL;
	for (int i = 1; i < n;) { /* the first entry is "= 0" in the enum: never in a block */
		int j = i;
		const char *text = "";
		while (j < n && e->param_patterns[j] && e->param_layers[j] == e->param_layers[i]) {
			text = arena_printf(a, "%s\t[%s] = %s(l),", text, e->param_patterns[j], e->param_macros[j]);
			j++;
		}
		if (j - i < 2) {
			i++;
			continue;
		}
		shape[i] = text;
		e->param_block_len[i] = j - i;
		symtab_put(count, text, (void *)(intptr_t)((intptr_t)symtab_get(count, text) + 1));
		i = j;
	}
	for (int i = 0; i < n; i++) {
		if (!e->param_block_len[i] || (intptr_t)symtab_get(count, shape[i]) < 2)
			continue;
		intptr_t k = (intptr_t)symtab_get(kind, shape[i]);
		if (!k) {
			k = ++e->nblock_kinds;
			symtab_put(kind, shape[i], (void *)k);
			const char *suffix = k > 1 ? arena_printf(a, "_%d", (int)k) : "";
			e->block_names[k - 1] = arena_printf(a, "LAYER_PARAM_NAMES%s", suffix);
			e->block_entries[k - 1] = arena_printf(a, "LAYER_PARAM_ENTRIES%s", suffix);
		}
		e->param_block[i] = (int)k - 1;
	}
}

/* The macro of a block kind over its first block's entries at i: each entry, as fmt prints its
 * pasted name and its layer macro, on a line of its own */
static void print_block_macro(Emit *e, const char *macro, int i, const char *fmt)
{
	fprintf(e->f, "#define %s(l)", macro);
	for (int j = i; j < i + e->param_block_len[i]; j++) {
		fprintf(e->f, " \\\n\t");
		fprintf(e->f, fmt, e->param_patterns[j], e->param_macros[j]);
	}
	fprintf(e->f, "\n");
}

/* The PARAM_ enum: one line an entry, one a layer's block */
static void print_param_enum(Emit *e)
{
	FILE *f = e->f;
	param_layer_blocks(e);
	for (int k = 0, i = 0; k < e->nblock_kinds; i++)
		if (e->param_block[i] == k) {
			if (!k)
				fprintf(f, "/* a layer's parameters: the same in every layer but for the number in their names */\n");
			print_block_macro(e, e->block_names[k++], i, "%s,%.0s");
		}
	fprintf(f, "/* the parameter table's entries (params[] below) */\nenum {\n");
	for (int i = 0; i < e->low->nparams; i++)
		if (e->param_block[i] >= 0) {
			fprintf(f, "\t%s(%d)\n", e->block_names[e->param_block[i]], e->param_layers[i]);
			i += e->param_block_len[i] - 1;
		} else {
			fprintf(f, "\t%s%s,\n", e->param_names[i], i ? "" : " = 0");
		}
	fprintf(f, "};\n\n");
}

static void print_program(Emit *e, const char *source_path)
{
	FILE *f = e->f;
	const Lowered *low = e->low;
	fprintf(f, "/* ================================================================ the program */\n\n");
	fputs(e->param_macro_defs, f);
	free(e->param_macro_defs);
	for (int k = 0, i = 0; k < e->nblock_kinds; i++)
		if (e->param_block[i] == k)
			print_block_macro(e, e->block_entries[k++], i, "[%s] = %s(l),");
	if (e->nblock_kinds)
		fprintf(f, "\n");
	fprintf(f, "static const planrt_param_t params[] = {\n");
	for (int i = 0; i < low->nparams; i++)
		if (e->param_block[i] >= 0) {
			fprintf(f, "\t%s(%d)\n", e->block_entries[e->param_block[i]], e->param_layers[i]);
			i += e->param_block_len[i] - 1;
		} else {
			print_param_entry(e, &low->params[i], i, e->param_macros[i], e->param_layers[i]);
		}
	fprintf(f, "};\n\n");
	fprintf(f, "static const planrt_stage_t stages[] = {\n");
	for (int i = 0; i < low->nprogs; i++) {
		e->p = low->progs[i];
		e->prefix = prog_prefix(low, e->p);
		e->stage_index = i;
		print_stage_entry(e);
	}
	fprintf(f, "};\n\n");
	ProgramDesc d = program_desc(low, source_path);
	bool decode = low->g->decode; /* the decode program: its descriptor is the training program's .decode */
	if (low->decode)
		fprintf(f, "extern const planrt_program_t planrt_decode_program; /* decode.c */\n");
	fprintf(f, decode ? "const planrt_program_t planrt_decode_program = {\n" : "static const planrt_program_t program = {\n");
	fprintf(f, "\t.plan = \"%s\",\n\t.model = \"%s\",\n\t.source = \"%s\",\n", d.plan, d.model, d.source);
	fprintf(f, "\t.world = %d,\n\t.naxes = %d,\n\t.pipe_axis = %s,\n", d.world, d.naxes, axis_or_none(e, d.pipe_axis));
	fprintf(f, "\t.axis_sizes = axis_sizes,\n\t.axis_names = axis_names,\n");
	fprintf(f, "\t.nstages = %d,\n\t.stages = stages,\n\t.params = params,\n\t.nparams = %d,\n", d.nstages, d.nparams);
	/* MICRO_BATCHES: the enum the phase functions use, d.micro_batches */
	fprintf(f, "\t.micro_batches = MICRO_BATCHES,\n\t.batch = %lld,\n\t.seq = %lld,\n\t.vocab = %lld,\n", d.batch, d.seq,
		d.vocab);
	fprintf(f, "\t.lr = ");
	print_double(f, d.lr);
	fprintf(f, ",\n\t.min_lr = ");
	print_double(f, d.min_lr);
	fprintf(f, ",\n\t.warmup = %d,\n\t.total_steps = %d,\n", d.warmup, d.total_steps);
	fprintf(f, "\t.nroles = %d,\n\t.role_axis = %s,\n", d.nroles, axis_or_none(e, d.role_axis));
	fprintf(f, "\t.fingerprint = \"%s\",\n\t.sync = \"%s\",\n\t.loss_scale = ", d.fingerprint, d.sync);
	print_double(f, d.loss_scale);
	fprintf(f, ",\n\t.optimizer = \"%s\",\n", d.optimizer);
	if (d.ring_axes)
		fprintf(f, "\t.ring_axes = 0x%xu,\n", d.ring_axes);
	fprintf(f, "%s};\n\n", low->decode ? "\t.decode = &planrt_decode_program,\n" : "");
	if (decode) { /* no main: prog.c's runs this program under --generate */
		fprintf(f, "__attribute__((used)) static void (*const helpers_)(void) = unused_helpers;\n");
		return;
	}
	fprintf(f, "int main(int argc, char **argv)\n{\n\tunused_helpers();\n\treturn %s(argc, argv, &program);\n}\n",
		e->target ? e->target->main_fn : "planrt_main");
	if (e->target)
		e->target->epilogue(e);
}

static bool print_file(const Lowered *low, const char *dir, const char *source_path, const EmitTarget *target,
		       bool layer_loops);

bool emit_c(const Lowered *low, const char *dir, const char *source_path, bool layer_loops)
{
	return print_file(low, dir, source_path, NULL, layer_loops);
}

bool emit_c_with(const Lowered *low, const char *dir, const char *source_path, const EmitTarget *target,
		 bool layer_loops)
{
	return print_file(low, dir, source_path, target, layer_loops);
}

/* Every stage of the program, from a fresh file-wide table of loop functions. */
static void print_stages(Emit *e)
{
	const Lowered *low = e->low;
	e->loop_shapes = symtab_new(low->g->arena);
	e->loop_alias = symtab_new(low->g->arena);
	for (int i = 0; i < low->nprogs; i++) {
		e->p = low->progs[i];
		e->prefix = prog_prefix(low, e->p);
		e->stage_index = i;
		print_stage(e);
	}
}

static bool print_file(const Lowered *low, const char *dir, const char *source_path, const EmitTarget *target,
		       bool layer_loops)
{
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "planc: error: cannot create directory '%s': %s\n", dir, strerror(errno));
		return false;
	}
	/* the decode program (planc build --generate) first, in DIR/decode.c beside prog.c */
	/* (the decode program prints its layers unrolled: a loop there is not checked yet) */
	if (low->decode && !print_file(low->decode, dir, source_path, target, false))
		return false;
	const char *path = arena_printf(low->g->arena, low->g->decode ? "%s/decode.c" : "%s/prog.c", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "planc: error: cannot write '%s': %s\n", path, strerror(errno));
		return false;
	}
	Emit e = {.f = f, .low = low, .target = target, .param_names = param_enum_names(low), .loop_functions = !target,
		  .layer_loops = layer_loops, .loop_as = -1};
	print_prelude(&e, source_path);
	e.nstate_entries = arena_alloc(low->g->arena, sizeof(int) * (size_t)(low->nprogs + 1));
	e.nfamily_entries = arena_alloc(low->g->arena, sizeof(int) * (size_t)(low->nprogs + 1));
	e.family_table = arena_alloc(low->g->arena, sizeof(char *) * (size_t)(low->nprogs + 1));
	e.stage_layers = arena_alloc(low->g->arena, sizeof(char *) * (size_t)(low->nprogs + 1));
	e.family_texts = arena_alloc(low->g->arena, sizeof(char *) * (size_t)(low->nprogs + 1)); /* a table a stage at most */
	e.family_names = arena_alloc(low->g->arena, sizeof(char *) * (size_t)(low->nprogs + 1));
	e.loop_shapes_seen = symtab_new(low->g->arena);
	e.shared_loops = !target && layer_loops && low->nprogs > 1;
	if (e.shared_loops) { /* two printings to learn from (one loop function for the stages): how each
			       * run holds its places, then the folded runs' shapes */
		char *text = NULL;
		size_t len = 0;
		if (!(e.f = open_memstream(&text, &len)))
			ICE("out of memory");
		e.learning_shapes = e.learning_places = true;
		e.places_seen = symtab_new(low->g->arena);
		print_stages(&e); /* which places differ in kind between stages */
		e.learning_places = false;
		e.family_macro = false;
		e.nfamily_tables = 0;
		print_stages(&e); /* the shapes */
		e.learning_shapes = false;
		e.family_macro = false;
		e.nfamily_tables = 0;
		if (fclose(e.f) != 0)
			ICE("out of memory");
		free(text);
		e.f = f;
	}
	print_stages(&e);
	print_program(&e, source_path);
	free(e.fields);
	bool ok = !ferror(f);
	if (fclose(f) != 0)
		ok = false;
	if (!ok)
		fprintf(stderr, "planc: error: writing '%s' failed\n", path);
	return ok;
}

/* ------------------------------------------------------------------ for other targets (emit_cuda.c) */

FILE *emit_file(const Emit *e)
{
	return e->f;
}

const LProg *emit_prog(const Emit *e)
{
	return e->p;
}

const char *emit_prefix(const Emit *e)
{
	return e->prefix;
}

const EmitTarget *emit_target(const Emit *e)
{
	return e->target;
}

int emit_stage(const Emit *e)
{
	return e->stage_index;
}

void emit_name(Emit *e, int b)
{
	name(e, b);
}

void emit_comment(Emit *e, const char *text)
{
	comment(e, text);
}

void emit_int(Emit *e, const char *label, long long v)
{
	if (e->holes) {
		Hole *h = hole(e, "int", label, arena_printf(e->low->g->arena, "%lld", v));
		h->integer = true;
		h->value = v;
	} else {
		fprintf(e->f, "%lld", v);
	}
}

void emit_arg(Emit *e, const Kernel *k, int i)
{
	print_arg(e, k, i);
}

void emit_double(Emit *e, double x)
{
	print_double(e->f, x);
}

void emit_c_kernel(Emit *e, const Kernel *k)
{
	const EmitTarget *t = e->target;
	e->target = NULL;
	print_kernel(e, k);
	e->target = t;
}

const char *emit_ctype(DType t)
{
	return ctype(t);
}

int emit_loop_loads(const Kernel *k, int *loads, int cap)
{
	int n = 0;
	collect(k->expr, loads, &n, cap);
	return n;
}

bool emit_loop_flat(const Kernel *k)
{
	return contiguous(k->expr, k);
}

void emit_loop_expr_to(FILE *f, const LProg *p, const Kernel *k, bool flat, const int *load_slot)
{
	Emit e = {.f = f, .low = p->low, .p = p, .prefix = "", .load_slot = load_slot};
	print_expr(&e, k->expr, k, flat);
}

void emit_c_loop_to(FILE *f, const Lowered *low, const LProg *p, const Kernel *k)
{
	Emit e = {.f = f, .low = low, .p = p, .prefix = ""};
	print_loop(&e, k);
}

/* ------------------------------------------------------------------ what the C target runs */

/* A dim split over two mesh axes a < b (block offset (coord(a) size(b) + coord(b)) ldim, as the
 * mesh orders ranks): executed for activations (the batch split over a data axis and an expert
 * axis, and what follows from it) when every collective that gathers or splits such a dim acts on
 * its inner axis b, so that blocks stay whole, or the dim has no name (an MoE buffer's slots, read
 * only where they are). Parameters and three axes are not. */
static bool two_axis_split_refused(const Graph *g, const Op *op, const Value *v, int a, int b)
{
	const PlanSpec *ps = g->ps;
	int d = v->lay.on[a];
	if (v->role == ROLE_PARAM || v->grad_of >= 0)
		return true;
	for (int c = 0; c < ps->naxes; c++)
		if (c != a && c != b && v->lay.on[c] == d)
			return true;
	if (op_classes[op->kind] != OPK_COLLECTIVE || op->kind == OP_ALL_REDUCE || !op->nin || !op->nout)
		return false;
	int dims[2] = {op->coll_dim, op->kind == OP_ALL_TO_ALL ? op->coll_dim2 : -1};
	const Value *ends[2] = {&g->vals[op->in[0]], &g->vals[op->out[0]]};
	for (int i = 0; i < 2; i++)
		for (int e = 0; e < 2; e++) {
			int dd = dims[i];
			if (dd < 0 || dd >= ends[e]->rank || !ends[e]->dim_name[dd])
				continue;
			for (int c = op->axis + 1; c < ps->naxes; c++)
				if (ends[e]->lay.on[c] == dd)
					return true;
		}
	return false;
}

bool lowered_executable(const Lowered *low, bool report)
{
	return lowered_executable_on(low, report, false);
}

/* device: for the CUDA target, which also checks its kernels (cuda_executable) */
bool lowered_executable_on(const Lowered *low, bool report, bool device)
{
	Graph *g = low->g;
	PlanSpec *ps = low->ps;
	const Source *src = ps->src;
	bool ok = true;
#define REFUSE(loc, ...)                                                                                   \
	do {                                                                                               \
		if (report)                                                                                \
			diag_error(src, loc, __VA_ARGS__);                                                 \
		ok = false;                                                                                \
	} while (0)
	if (g->has_moe && ps->sync != SYNC_STRICT)
		REFUSE(ps->sync_loc, "planc build runs mixture-of-experts layers under sync strict only (this plan's is %s)",
		       ps->sync == SYNC_ASYNC ? "async" : "local_sgd");
	int batch_axes = 0;
	for (int r = 0; r < ps->nrules; r++)
		batch_axes += ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim);
	if (batch_axes > 1 && (ps->sync != SYNC_STRICT || ps->compress != COMPRESS_NONE))
		REFUSE(ps->sync_loc, "sync strategies other than strict need the batch split over one mesh axis (this plan "
				     "splits %s over %d)", ps->batch_dim, batch_axes);
	/* PLANC_TEST_HOST_OFFLOAD_ON_CPU: the tests run the CUDA target's host-offload program on the
	 * CPU (where host and device memory are one), against the plan without offload
	 * (tests/equiv/check_offload.py); it frees nothing there, so users get the refusal */
	bool cpu_test = getenv("PLANC_TEST_HOST_OFFLOAD_ON_CPU") != NULL;
	if (!device && !cpu_test &&
	    (ps->offload_optimizer == PLACE_HOST || ps->offload_params == PLACE_HOST || ps->offload_activations == PLACE_HOST)) {
		REFUSE(ps->offload_loc, "offload %s -> host moves state out of GPU memory: the CPU target has none to free",
		       ps->offload_optimizer == PLACE_HOST ? "optimizer" : ps->offload_params == PLACE_HOST ? "params" : "activations");
		if (report)
			diag_note_plain("build it with --target cuda, or offload the optimizer state to disk on the CPU "
					"(offload optimizer -> disk)");
	} else if (ps->offload_params == PLACE_DISK || ps->offload_activations == PLACE_DISK) {
		REFUSE(ps->offload_loc, "planc build does not execute offload %s -> disk yet (it runs offload optimizer -> "
					"disk, and -> host on the CUDA target)",
		       ps->offload_params == PLACE_DISK ? "params" : "activations");
	}
	if (ps->compress != COMPRESS_NONE && ps->param_dtype != DT_F32 &&
	    !(ps->compress == COMPRESS_BF16 && ps->param_dtype == DT_BF16))
		REFUSE(ps->sync_loc, "planc build compresses f32 gradients so far (this plan's are %s)", dtype_name(ps->param_dtype));
	if (ps->param_dtype != DT_F32 && ps->param_dtype != DT_BF16 && ps->param_dtype != DT_F16)
		REFUSE(ps->plan->name_loc, "planc build executes f32, bf16 and f16 plans so far (this plan uses %s)",
		       dtype_name(ps->param_dtype));
	if (ps->param_dtype == DT_F16 && ps->sync != SYNC_STRICT)
		REFUSE(ps->sync_loc, "fp16 loss scaling skips a step on every rank at once: %s replicas step on their own",
		       ps->sync == SYNC_ASYNC ? "async" : "local_sgd");
	for (int i = 0; i < g->nops && ok; i++) {
		const Op *op = &g->ops[i];
		if (op->kind == OP_INPUT && g->vals[op->out[0]].tied_to < 0) {
			const Value *v = &g->vals[op->out[0]];
			if (!ps->batch_dim || !v->rank || !v->dim_name[0] || strcmp(v->dim_name[0], ps->batch_dim))
				REFUSE(op->loc, "planc build loads an input's samples along its first dim, the batch dim%s%s",
				       ps->batch_dim ? " " : "", ps->batch_dim ? ps->batch_dim : "");
		}
		for (int k = 0; k <= op->nout && ok; k++) { /* the outputs, and a collective's input */
			if (k == op->nout && (op_classes[op->kind] != OPK_COLLECTIVE || !op->nin))
				break;
			const Value *v = &g->vals[k < op->nout ? op->out[k] : op->in[0]];
			for (int a = 0; a < ps->naxes; a++)
				for (int b = a + 1; b < ps->naxes; b++)
					if (v->lay.on[a] >= 0 && v->lay.on[a] == v->lay.on[b] && two_axis_split_refused(g, op, v, a, b))
						REFUSE(op->src ? op->loc : ps->plan->name_loc,
						       "planc build cannot execute this split of a dimension over two mesh axes ('%s' and '%s') yet",
						       ps->axes[a].name, ps->axes[b].name);
		}
	}
	for (int i = 0; i < low->nprogs && ok; i++) {
		const LProg *p = low->progs[i];
		for (int k = 0; k < p->nk && ok; k++)
			if (p->k[k].kind == K_OPAQUE) {
				const Op *op = p->k[k].op >= 0 ? &g->ops[p->k[k].op] : NULL;
				REFUSE(op && op->src ? op->loc : ps->plan->name_loc, "planc build cannot execute '%s' yet",
				       op ? op_names[op->kind] : "an operation");
			}
	}
#undef REFUSE
	if (!ok && report)
		diag_note_plain("'planc check' and 'planc explain' handle this plan; only execution is missing");
	return ok;
}
