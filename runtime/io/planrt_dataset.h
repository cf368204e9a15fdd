/* planrt_dataset.h: data sets of named tensors (dataset.c), the data of models whose inputs are not
 * token windows: inputs of any dtype and shape, with per-sample labels.
 *
 * A data set is a .safetensors file or a directory of NAME.npy files (numpy's format, C order), one
 * tensor per model input, named after it, whose first dim counts the samples (the same count in
 * every tensor) and whose other dims are the input's dims after the batch dim. Float tensors (F64,
 * F32, F16, BF16) feed float inputs, integer ones (I64, I32, I16, I8, U8, BOOL) i32 inputs (each
 * value must fit) and float inputs (a 0/1 mask). data.c decides which sample each row of a step's
 * global batch is (docs/data.md): it depends only on (file, seed, step). Every input is checked
 * against the model the first time it is loaded, labels against their classes and token ids
 * against the embedding table they index (every value of the tensor), before the first step
 * trains: a mismatch ends the run with a one-line cause that names the tensor, the sample and the
 * value. */
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
/* The load_input kernel's work for a data set (input.c dispatches): samples[r] for local row r
 * (ldims[0] of them) of input name into dst, each sample's block at offs[1..]; the tensor is
 * checked against the input the first time: labels against classes > 0, token ids against the
 * -classes rows of the embedding table they index when classes < 0. */
void planrt_dataset_load_(planrt_dataset_t d, const int64_t *samples, void *dst, const char *name, planrt_dtype_t t,
			  int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes);
/* whether the data set has a tensor of that name */
int planrt_dataset_has_(planrt_dataset_t d, const char *name);
/* input padding_mask (f32 [B, 1, 1, S] or [B, S]) of samples[r] from the data set's `lengths`: 0 on
 * a sample's first lengths keys, -inf on the rest (an additive attention mask) */
void planrt_dataset_padding_mask_(planrt_dataset_t d, const int64_t *samples, void *dst, planrt_dtype_t t, int rank,
				  const int64_t *gdims, const int64_t *ldims, const int64_t *offs);
/* "[B, S]": a shape for messages */
const char *planrt_shape_text_(int rank, const int64_t *dims, char *buf, size_t n);
/* the data set of a --data file opened by planrt_data_open, or NULL for token data (data.c) */
planrt_dataset_t planrt_data_set(planrt_data_t d);
/* data.c: which sample each row of a batch is (docs/data.md). A row is a window of a token source
 * (src, its first token at) or a sample of a data set (set, sample at). */
typedef struct planrt_row {
	const struct planrt_source *src;
	planrt_dataset_t set;
	int64_t at;
} planrt_row_t;
/* rows [lo, hi) of step's global batch, or of held-out batch eval_batch when it is >= 0 */
planrt_result_t planrt_data_rows_(planrt_data_t d, int64_t step, int64_t eval_batch, int64_t lo, int64_t hi,
				  uint64_t seed, planrt_row_t *rows);
void planrt_data_window_(const planrt_row_t *row, int64_t seq, int32_t *tokens); /* seq + 1 tokens */
/* where the document holding token pos of the window starts (0 when before the window) */
int64_t planrt_data_doc_start_(const planrt_row_t *row, int64_t pos);
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
