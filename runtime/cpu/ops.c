/* ops.c: the language ops' kernels that the IR calls with its own argument conventions (every
 * call returns void; a loss is written into its scalar buffer; bad labels end the run with their
 * value and position). The arithmetic is planrt_kernels.h's. */
#define PLANRT_INTERNAL
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <stdio.h>
#include <string.h>

void planrt_regression_loss_f32(int l1, const float *x, const float *target, int64_t n, double scale, float *loss)
{
	*loss = (float)(l1 ? planrt_k_l1_loss_f32(x, target, n, scale) : planrt_k_mse_loss_f32(x, target, n, scale));
}

void planrt_regression_loss_grad_f32(int l1, const float *x, const float *target, int64_t n, double dscale, float *dx)
{
	if (l1)
		planrt_k_l1_loss_grad_f32(x, target, n, dscale, dx, NULL);
	else
		planrt_k_mse_loss_grad_f32(x, target, n, dscale, dx, NULL);
}

void planrt_narrow_i32(const int32_t *x, int32_t *y, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len)
{
	for (int64_t o = 0; o < outer; o++)
		memcpy(y + o * len * inner, x + (o * n + start) * inner, sizeof(int32_t) * (size_t)(len * inner));
}

void planrt_check_labels(const int32_t *labels, int rank, const int64_t *ldims, const int64_t *offs, int64_t classes,
			 const char *what, int64_t step)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= ldims[d];
	int64_t bad_index = 0;
	int32_t bad_value = 0;
	if (!planrt_k_check_labels(labels, n, classes, INT32_MIN, NULL, &bad_index, &bad_value))
		return;
	/* the bad label's position in the step's global batch */
	char at[256];
	int len = snprintf(at, sizeof at, "[");
	int64_t rest = bad_index;
	int64_t idx[8] = {0};
	for (int d = rank - 1; d >= 0; d--) {
		idx[d] = ldims[d] ? rest % ldims[d] : 0;
		rest = ldims[d] ? rest / ldims[d] : 0;
	}
	for (int d = 0; d < rank && len < (int)sizeof at - 24; d++)
		len += snprintf(at + len, sizeof at - (size_t)len, "%s%lld", d ? ", " : "",
				(long long)planrt_block_pos(rank, ldims, offs, d, idx[d]));
	snprintf(at + len, sizeof at - (size_t)len, "]");
	planrt_fatal("step %lld: label %d at %s of %s is outside the %lld classes of its cross_entropy; labels must be "
		     "in [0, %lld): fix the data or the model's number of classes",
		     (long long)step, bad_value, at, what, (long long)classes, (long long)classes);
}
