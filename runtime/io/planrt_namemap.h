/* planrt_namemap.h: checkpoints under another framework's names (namemap.c): --map FILE makes
 * --init read and --save write a safetensors file in, say, Hugging Face's Llama layout.
 *
 * A map file has one line per rule, `PLANC_PATTERN FILE_PATTERN [T] [cat]` (# starts a comment):
 *   wte                                      model.embed_tokens.weight
 *   layers.{i}.llama_block.gqa_attention.wq  model.layers.{i}.self_attn.q_proj.weight  T
 * {i} stands for a layer index (digits), the same in both names. T: the file holds the 2-D tensor
 * transposed (torch.nn.Linear's [out, in] against planc's [in, out]). cat: the file tensor is the
 * concatenation along its first dim of every parameter mapped to it with cat, in the order of
 * the map's lines (a fused q/k/v projection: wq, wk and wv are its row blocks). `- FILE_NAME`: a
 * tensor of the file that --init leaves unread (any other that no parameter reads is an error).
 * The first rule
 * whose pattern matches a parameter decides; a parameter no rule matches keeps its name. stdlib/maps
 * holds maps for the stdlib's models. */
#ifndef PLANRT_NAMEMAP_H
#define PLANRT_NAMEMAP_H

#include "planrt_program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct planrt_namemap *planrt_namemap_t;

/* Reads the map and binds every parameter of the program to its file tensor; a malformed line,
 * a transpose of a tensor that is not 2-D or parts of one fused tensor that disagree on its
 * other dims are one-line errors. */
planrt_result_t planrt_namemap_open(const char *path, const planrt_program_t *prog, planrt_namemap_t *out);
/* Every tensor of the --init file `f` (at `path`) is read by some parameter or named by a
 * `- FILE_NAME` rule; otherwise a one-line error naming the first that is neither. */
planrt_result_t planrt_namemap_check_file(planrt_namemap_t m, planrt_st_t f, const char *path);
void planrt_namemap_close(planrt_namemap_t m);
/* The block [offs, offs + ldims) of parameter `param` (planc's layout) from the file, as f32. */
planrt_result_t planrt_namemap_read_block(planrt_namemap_t m, planrt_st_t f, int param, const int64_t *ldims,
					  const int64_t *offs, float *dst);
/* Rewrites the checkpoint `from` (planc's names and layouts, as --save writes it) as `to` under the
 * map's names and layouts (atomically, planrt_st_write). */
planrt_result_t planrt_namemap_convert(planrt_namemap_t m, const char *from, const char *to);

#ifdef __cplusplus
}
#endif
#endif
