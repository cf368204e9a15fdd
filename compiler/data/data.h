/* data.h: `planc data`, the step that turns text into the token files planrt trains on
 * (docs/data.md). A folder of its own beside the compiler's stages: it includes only the C
 * library and jansson, and nothing of the compiler includes it but main.c.
 *
 *   bpe.c              GPT-2's byte-level BPE: the pre-tokenization pattern, vocab.json +
 *                      merges.txt, encoding, decoding and training a vocabulary
 *   unicode_classes.c  the letter and number code point ranges the pattern needs (generated)
 *   data_cli.c         planc data vocab | tokenize | decode: documents in, Megatron / nanoGPT /
 *                      llm.c token files out */
#ifndef PLANC_DATA_H
#define PLANC_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- unicode_classes.c */
extern const uint32_t bpe_letter_ranges[][2];
extern const int bpe_letter_ranges_count;
extern const uint32_t bpe_number_ranges[][2];
extern const int bpe_number_ranges_count;

/* ---------------------------------------------------------------- bpe.c */
typedef struct Bpe Bpe;
/* dir/vocab.json and dir/merges.txt (GPT-2's files); NULL with the cause in err */
Bpe *bpe_load(const char *dir, char *err, size_t errn);
void bpe_free(Bpe *b);
int bpe_vocab_size(const Bpe *b);
int32_t bpe_eot(const Bpe *b); /* <|endoftext|>, or -1 */
/* GPT-2's pre-tokenization: where the piece of text[0, n) that starts at i ends */
size_t bpe_next_piece(const char *text, size_t n, size_t i);
/* Appends the ids of text[0, n) to ids (grown as needed); -1 when out of memory. */
int bpe_encode(const Bpe *b, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap);
/* The bytes of ids, written to out; -1 for an id outside the vocabulary. */
int bpe_decode(const Bpe *b, const int32_t *ids, size_t n, FILE *out);
/* Trains a vocabulary of vocab_size tokens on text (the 256 bytes, then merges, then
 * <|endoftext|>) and writes dir/vocab.json and dir/merges.txt; -1 with the cause in err. */
int bpe_train(const char *text, size_t n, int vocab_size, const char *dir, char *err, size_t errn);

/* ---------------------------------------------------------------- data_cli.c */
/* planc data ARGS (argv[0] is "data"): the process exit status */
int data_main(int argc, char **argv);

#endif
