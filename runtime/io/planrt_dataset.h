/* planrt_dataset.h: data sets of named tensors (dataset.c), the data of models whose inputs are not
 * token windows: inputs of any dtype and shape, with per-sample labels.
 *
 * A data set is a .safetensors file or a directory of NAME.npy files (numpy's format, C order), one
 * tensor per model input, named after it, whose first dim counts the samples (the same count in
 * every tensor) and whose other dims are the input's dims after the batch dim. Float tensors (F64,
 * F32, F16, BF16) feed float inputs, integer ones (I64, I32, I16, I8, U8, BOOL) i32 inputs (each
 * value must fit). Sample i of step t of the global batch is data set sample
 * Philox(seed, (t, i)) mod N, as token windows are drawn: it depends only on (file, seed, step).
 * Every input is checked against the model the first time it is loaded, labels against their
 * classes (every value of the tensor), before the first step trains: a mismatch ends the run with a
 * one-line cause that names the tensor, the sample and the value. */
#ifndef PLANRT_DATASET_H
#define PLANRT_DATASET_H

#include "planrt_program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct planrt_dataset *planrt_dataset_t;

/* whether path names a data set (a .safetensors or .npy file, or a directory) rather than tokens */
int planrt_dataset_path(const char *path);
planrt_result_t planrt_dataset_open(const char *path, planrt_dataset_t *out);
void planrt_dataset_close(planrt_dataset_t d);
int64_t planrt_dataset_samples(planrt_dataset_t d);
/* The load_input kernel's work for a data set (input.c dispatches): the rows [offs[0], +ldims[0])
 * of the step's global batch of input name into dst, each sample's block at offs[1..]; the
 * tensor is checked against the input (and labels against classes > 0) the first time. */
void planrt_dataset_load_(planrt_dataset_t d, const planrt_ctx_t *ctx, void *dst, const char *name, planrt_dtype_t t,
			  int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes);
/* "[B, S]": a shape for messages */
const char *planrt_shape_text_(int rank, const int64_t *dims, char *buf, size_t n);
/* the data set of a --data file opened by planrt_data_open, or NULL for token data (data.c) */
planrt_dataset_t planrt_data_set(planrt_data_t d);
/* token data: the first target token (any token but the first) at or above classes, 1 if any */
int planrt_data_check_tokens_(planrt_data_t d, int64_t classes, int64_t *pos, int32_t *bad);

/* safetensors.c: the tensors of an open file, for data sets (dtype: the format's name, "F32") */
int planrt_st_count(planrt_st_t f);
void planrt_st_raw(planrt_st_t f, int i, const char **name, const char **dtype, int *rank, int64_t *dims,
		   const void **data);

#ifdef __cplusplus
}
#endif
#endif
