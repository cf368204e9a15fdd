/* inplace.c: outputs written over an input that dies at the kernel, the pass before memplan.
 *
 * memplan gives two buffers that are live at the same kernel different bytes, so a kernel's output
 * never shares memory with its inputs. Where the kernel is elementwise in an input (each output
 * element computed from the same element of that input and nothing else of it, read before it is
 * written) and that input dies at the kernel, the output can be the input's own memory, as llm.c's
 * fused classifier writes the logits' gradient over the logits. Here such an output becomes a view
 * of the input, and memplan places the two as one.
 *
 * The kernel this is done for: the cross-entropy's gradient (cross_entropy_grad and _16), whose
 * dlogits[r, j] = exp(logits[r, j] - lse[r]) * ds, less ds at the target: the largest buffer pair of
 * a language model's step (gpt350m in bf16: 8192 x 50304 logits, 824 MB, and as much again for
 * their gradient, both live at the start of the backward). The runtime's kernels (CPU, LLVM and
 * CUDA) compute it element by element.
 *
 * Taken only where it cannot change a result: both buffers transient (not state, not a view), of
 * one dtype and size; the input is read by no kernel after this one and the output touched by none
 * before it. */
#include "lower/lower.h"

/* the (input, output) parameters of the kernels that may write their output over their input */
static bool elementwise_pair(KernelKind kind, int *in, int *out)
{
	switch (kind) {
	case K_CE_GRAD:
		*in = KARG_INDEX(CE_GRAD, logits);
		*out = KARG_INDEX(CE_GRAD, dlogits);
		return true;
	case K_CE_GRAD_16:
		*in = KARG_INDEX(CE_GRAD_16, logits);
		*out = KARG_INDEX(CE_GRAD_16, dlogits);
		return true;
	default:
		return false;
	}
}

/* whether kernel k reads or writes buffer b, or a view of it */
static bool touches_root(const LProg *p, const Kernel *k, int b)
{
	for (int u = 0; u < k->nuses; u++)
		if (buffer_root(p, k->uses[u]) == b)
			return true;
	for (int d = 0; d < k->ndefs; d++)
		if (buffer_root(p, k->defs[d]) == b)
			return true;
	return false;
}

static bool can_share(const LProg *p, int i, int x, int y)
{
	const Buffer *bx = &p->buf[x], *by = &p->buf[y];
	if (x == y || bx->cls != BUF_ARENA || by->cls != BUF_ARENA || bx->dtype != by->dtype || bx->elems != by->elems ||
	    bx->bytes != by->bytes)
		return false;
	for (int b = 0; b < p->nbuf; b++) /* nothing views either */
		if (p->buf[b].cls == BUF_VIEW && (p->buf[b].view_of == x || p->buf[b].view_of == y))
			return false;
	for (int j = 0; j < p->nk; j++)
		if ((j < i && touches_root(p, &p->k[j], y)) || (j > i && touches_root(p, &p->k[j], x)))
			return false;
	return true;
}

bool plan_inplace(Lowered *low)
{
	for (int s = 0; s < low->nprogs; s++) {
		LProg *p = low->progs[s];
		for (int i = 0; i < p->nk; i++) {
			const Kernel *k = &p->k[i];
			int in, out;
			if (!elementwise_pair(k->kind, &in, &out) || k->args[in].kind != KA_BUF || k->args[out].kind != KA_BUF)
				continue;
			int x = k->args[in].buf, y = k->args[out].buf;
			if (!can_share(p, i, x, y))
				continue;
			Buffer *by = &p->buf[y];
			by->cls = BUF_VIEW;
			by->view_of = x;
			by->view_off = 0;
			by->view_axis = -1;
		}
	}
	return true;
}
