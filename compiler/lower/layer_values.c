/* layer_values.c: what each value that may differ by layer is, in a run of identical layers
 * (layer_runs.c), for the targets that run the run as one loop over the layer l (issue 21).
 *
 * A run's layers make the same kernels with the same arguments up to a renaming of buffers, a
 * random stream's key, a parameter-table index and a message. Each such value, given as its n
 * layers' values (a buffer of the stage, an integer, a text), is one of:
 *   LV_SAME      the same in every layer;
 *   LV_PLACE     a transient buffer (arena, slot or inbox) at offset + l * step, of one dtype
 *                (step 0: one place under other names, as the arena's scratch buffers);
 *   LV_VIEW      a view of one buffer at offset + l * step, step != 0, of one dtype (each layer's
 *                gradient in one flat gradient bucket: the first layer's pointer plus a stride);
 *   LV_INT_STEP  an integer first + l * step (parameter indices, keys);
 *   LV_STATE     a state buffer of each layer, of one kind, size and dtype: the entries of a
 *                stage's state *family*, one array of pointers, one a layer;
 *   LV_TABLE     anything else: a per-layer table.
 * The C walker (target/c/emit_c.c) classifies the holes of the text it prints this way, the LLVM
 * builder (target/llvm/emit_llvm.c) the arguments of the IR; both keep a stage's families in a
 * LayerFamilies, made from the longest runs first, so that every loop indexing one of its
 * members indexes the same array (at + dir * l). An analysis: it changes nothing in the IR. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

static bool value_equal(const LayerValue *a, const LayerValue *b)
{
	if (a->text && b->text)
		return !strcmp(a->text, b->text);
	return a->buf == b->buf && a->integer == b->integer && a->value == b->value;
}

/* buffer b's place in the stage's memory: its class when transient, else BUF_NONE */
static BufClass transient_class(const LProg *p, int b)
{
	BufClass c = b >= 0 ? p->buf[b].cls : BUF_NONE;
	return buf_class_transient(c) ? c : BUF_NONE;
}

static bool place_steps(const LProg *p, const LayerValue *v, int n, long long *step)
{
	BufClass c = transient_class(p, v[0].buf);
	if (c == BUF_NONE || n < 2)
		return false;
	const Buffer *x = &p->buf[v[0].buf];
	*step = (long long)p->buf[v[1].buf].offset - (long long)x->offset;
	for (int t = 1; t < n; t++) {
		const Buffer *y = v[t].buf >= 0 ? &p->buf[v[t].buf] : NULL;
		if (!y || transient_class(p, v[t].buf) != c || y->dtype != x->dtype ||
		    (long long)y->offset - (long long)x->offset != t * *step)
			return false;
	}
	return true;
}

/* v's buffers are views of one buffer at a fixed place each (no mesh coordinate or slot in it), of
 * its storage's dtype (the C walker's pointers are typed by the storage), at offsets that step
 * evenly by a nonzero *step bytes */
static bool view_steps(const LProg *p, const LayerValue *v, int n, long long *step)
{
	if (n < 2 || v[0].buf < 0 || v[1].buf < 0)
		return false;
	const Buffer *x = &p->buf[v[0].buf];
	long long size = dtype_bytes(x->dtype);
	*step = (p->buf[v[1].buf].view_off - x->view_off) * size;
	for (int t = 0; t < n; t++) {
		const Buffer *y = v[t].buf >= 0 ? &p->buf[v[t].buf] : NULL;
		if (!y || y->cls != BUF_VIEW || y->view_axis != -1 || y->view_of != x->view_of || y->dtype != x->dtype ||
		    p->buf[buffer_root(p, v[t].buf)].dtype != y->dtype || (y->view_off - x->view_off) * size != t * *step)
			return false;
	}
	return *step != 0;
}

static bool integer_steps(const LayerValue *v, int n, long long *step)
{
	if (!v[0].integer || n < 2)
		return false;
	*step = v[1].value - v[0].value;
	for (int t = 1; t < n; t++)
		if (!v[t].integer || v[t].value - v[0].value != t * *step)
			return false;
	return true;
}

static bool state_alike(const LProg *p, const LayerValue *v, int n)
{
	const Buffer *x0 = v[0].buf >= 0 ? &p->buf[v[0].buf] : NULL;
	for (int t = 0; t < n; t++) {
		const Buffer *x = v[t].buf >= 0 ? &p->buf[v[t].buf] : NULL;
		if (!x || x->cls != BUF_STATE || x->state != x0->state || x->bytes != x0->bytes || x->dtype != x0->dtype)
			return false;
	}
	return true;
}

LayerClass layer_value_class(const LProg *p, const LayerValue *v, int n)
{
	long long step = 0;
	bool same = true;
	for (int t = 1; t < n && same; t++)
		same = value_equal(&v[0], &v[t]);
	if (same)
		return (LayerClass){LV_SAME, 0};
	if (place_steps(p, v, n, &step))
		return (LayerClass){LV_PLACE, step};
	if (view_steps(p, v, n, &step))
		return (LayerClass){LV_VIEW, step};
	if (integer_steps(v, n, &step))
		return (LayerClass){LV_INT_STEP, step};
	if (state_alike(p, v, n))
		return (LayerClass){LV_STATE, 0};
	return (LayerClass){LV_TABLE, 0};
}

void layer_families_init(LayerFamilies *fs, const LProg *p)
{
	*fs = (LayerFamilies){0};
	fs->family_of = malloc(sizeof(int) * ((size_t)p->nbuf + 1));
	fs->family_at = malloc(sizeof(int) * ((size_t)p->nbuf + 1));
	if (!fs->family_of || !fs->family_at)
		ICE("out of memory");
	for (int b = 0; b < p->nbuf; b++)
		fs->family_of[b] = fs->family_at[b] = -1;
}

void layer_families_free(LayerFamilies *fs)
{
	for (int f = 0; f < fs->n; f++)
		free(fs->members[f]);
	free(fs->members);
	free(fs->size);
	free(fs->family_of);
	free(fs->family_at);
	*fs = (LayerFamilies){0};
}

/* A new family of bufs (a run's layers' buffers; down: the run walks the layers downwards), kept
 * in layer order. */
static int new_family(LayerFamilies *fs, const int *bufs, int n, bool down)
{
	if (fs->n == fs->cap) {
		fs->cap = fs->cap ? 2 * fs->cap : 16;
		fs->members = realloc(fs->members, sizeof(int *) * (size_t)fs->cap);
		fs->size = realloc(fs->size, sizeof(int) * (size_t)fs->cap);
		if (!fs->members || !fs->size)
			ICE("out of memory");
	}
	int f = fs->n++;
	fs->members[f] = malloc(sizeof(int) * (size_t)n);
	if (!fs->members[f])
		ICE("out of memory");
	fs->size[f] = n;
	for (int t = 0; t < n; t++) {
		int b = bufs[down ? n - 1 - t : t];
		fs->members[f][t] = b;
		fs->family_of[b] = f;
		fs->family_at[b] = t;
	}
	return f;
}

int layer_family(LayerFamilies *fs, const int *bufs, int n, bool down, int *at, int *dir)
{
	int b0 = bufs[0], f = fs->family_of[b0];
	if (f < 0) {
		if (fs->fixed)
			return -1;
		for (int t = 0; t < n; t++)
			if (fs->family_of[bufs[t]] >= 0)
				return -1;
		f = new_family(fs, bufs, n, down);
	}
	*at = fs->family_at[b0];
	*dir = fs->family_of[bufs[1]] == f ? fs->family_at[bufs[1]] - *at : 0;
	if (*dir != 1 && *dir != -1)
		return -1;
	for (int t = 0; t < n; t++)
		if (fs->family_of[bufs[t]] != f || fs->family_at[bufs[t]] != *at + *dir * t)
			return -1;
	return f;
}
