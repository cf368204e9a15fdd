/* planrt_tokens.h: token files (token_file.c) and the sampling rules that draw a step's samples
 * from them (sampling.c). Internal to planrt's io/ folder: data.c builds the --data sources of a
 * run from these; docs/data.md gives every format and formula.
 *
 * A token file is mapped, never read whole: text (bytes, vocabulary 256), nanoGPT's raw uint16
 * .bin, llm.c's shards (a 256-int32 header: magic 20240520 version 1 uint16 tokens, or magic
 * 20240801 version 7 uint32 tokens) and Megatron-LM's indexed data set (PREFIX.bin + PREFIX.idx:
 * the documents' boundaries). Every token is checked against the vocabulary when the file is
 * opened, so a bad file fails before training with its position and the fix. */
#ifndef PLANRT_TOKENS_H
#define PLANRT_TOKENS_H

#define PLANRT_INTERNAL
#include "planrt.h"

/* ---------------------------------------------------------------- token_file.c */
typedef struct planrt_tokens planrt_tokens_t;
/* Opens path (for Megatron also PREFIX, PREFIX.bin or PREFIX.idx) and checks every token below
 * vocab; text files need vocab >= 256. */
planrt_result_t planrt_tokens_open_(const char *path, int64_t vocab, planrt_tokens_t **out);
void planrt_tokens_close_(planrt_tokens_t *t);
int64_t planrt_tokens_count_(const planrt_tokens_t *t);
const char *planrt_tokens_format_(const planrt_tokens_t *t); /* "text", "nanogpt", "llm.c", "megatron" */
const char *planrt_tokens_path_(const planrt_tokens_t *t);
/* tokens [at, at + n) into dst (the caller keeps at + n <= count) */
void planrt_tokens_read_(const planrt_tokens_t *t, int64_t at, int64_t n, int32_t *dst);
/* the number of documents (1 for formats without boundaries) and where the document holding token
 * pos starts */
int64_t planrt_tokens_documents_(const planrt_tokens_t *t);
int64_t planrt_tokens_doc_start_(const planrt_tokens_t *t, int64_t pos);

/* ---------------------------------------------------------------- sampling.c */
/* Position j in [0, n) of epoch `epoch`'s permutation of [0, n) drawn from seed: a 4-round Feistel
 * network on the smallest even number of bits 2h with 4^h >= n, each round's function Philox's
 * first word, cycle-walked back into [0, n). A bijection of [0, n) for every (seed, epoch): an
 * epoch visits every sample once, in an order that depends on nothing but (seed, epoch). */
uint64_t planrt_shuffle_(uint64_t seed, uint64_t epoch, uint64_t j, uint64_t n);
/* Megatron-LM's blending rule: sample g of a blend of n sources with weights w (summing to 1)
 * comes from the source d maximising w[d] * max(g, 1) - count[d], the first such d on a tie,
 * where count[d] is the number of samples 0 .. g - 1 that d gave; it is that source's count[d]-th
 * sample. Sequential by nature: the state remembers where it is, and replays from 0 when asked
 * for an earlier sample (a resumed run replays once). */
enum { PLANRT_MAX_BLEND = 64 };
typedef struct planrt_blend {
	int n;
	double w[PLANRT_MAX_BLEND];
	int64_t at; /* the next sample index the counts are for */
	int64_t count[PLANRT_MAX_BLEND];
} planrt_blend_t;
void planrt_blend_init_(planrt_blend_t *b, int n, const double *weights);
void planrt_blend_pick_(planrt_blend_t *b, int64_t g, int *source, int64_t *k);

#endif
