/* attention_worst.h: the comparison the tiled attention's tests share (test_attention_tiles.c on the
 * host, test_attention_tiles_gpu.cu on a GPU): the largest difference of two tensors over the
 * largest magnitude of the first, their elements f32 or stored as a 16-bit type (widened by
 * planrt_cast); a NaN or an infinity on one side only is an infinite difference. */
#ifndef TESTS_CUDA_ATTENTION_WORST_H
#define TESTS_CUDA_ATTENTION_WORST_H

#include <math.h>
#include <stdint.h>

#include "planrt_exec.h"

static double attention_worst(const void *a, const void *b, int64_t n, planrt_dtype_t t)
{
	double w = 0, big = 1e-6;
	for (int64_t i = 0; i < n; i++) {
		float x, y;
		if (t == planrt_f32) {
			x = ((const float *)a)[i];
			y = ((const float *)b)[i];
		} else {
			planrt_cast((const uint16_t *)a + i, t, &x, planrt_f32, 1);
			planrt_cast((const uint16_t *)b + i, t, &y, planrt_f32, 1);
		}
		if (isnan(x) != isnan(y) || isinf(x) != isinf(y))
			return INFINITY;
		if (isinf(x))
			continue;
		double d = fabs((double)x - y);
		w = d > w ? d : w;
		big = fabs(x) > big ? fabs(x) : big;
	}
	return w / big;
}

#endif
