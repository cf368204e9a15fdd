/* fuzz_inputs.c: a libFuzzer harness for the files a user (or a damaged disk) hands planc's
 * programs and `planc data`: safetensors weights (--init, --resume's rank files: safetensors.c),
 * token files (--data: token_file.c's Megatron indexed data set, llm.c shards, nanoGPT's raw
 * tokens, text), and GPT-2 vocabularies and the text `planc data tokenize` encodes
 * (compiler/data/bpe.c), data sets of named tensors (dataset.c's .npy reader) and --map name maps
 * (namemap.c). Each is hostile: a malformed file must end in a one-line error, never in
 * a crash, a read outside the mapping or an overflow (the harness builds these sources with
 * AddressSanitizer and UndefinedBehaviorSanitizer, tests/fuzz/CMakeLists.txt).
 *
 * The input's first byte picks the reader (its value modulo 8), the rest is the file:
 *   0  a .safetensors file: opened (every header check), then every tensor of a dtype planrt
 *      converts (F32, BF16, F16) and at most MAX_ELEMS elements read whole as floats
 *   1  a Megatron pair: two bytes give the index's length L (little-endian, at most the rest), the
 *      next L bytes are data.idx and what follows data.bin; opened by data.idx
 *   2  a .bin: an llm.c shard if its header says so, else nanoGPT's uint16 tokens
 *   3  a text file: each byte a token
 *   4  text for the BPE encoder, with a vocabulary of 320 tokens trained at start-up: encoded,
 *      and the ids decoded back, which must give the text's bytes again
 *   5  a vocabulary: two bytes give vocab.json's length (as for 1), then merges.txt; loaded, and
 *      where it loads, "hello world" encoded and decoded
 *   6  x.npy in a data-set directory: opened (magic, version, header, dtype, shape against the
 *      file's size)
 *   7  a --map file, bound to the parameters of a two-layer Llama (LLAMA_PARAMS: the names
 *      stdlib/maps/hf_llama.map maps)
 * A token file that opens is read: its first and last MAX_TOKENS tokens, and where it has
 * documents, the start of the document at a few positions.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DPLANC_FUZZ=ON && make -C build-fuzz fuzz_inputs
 *   build-fuzz/tests/fuzz/fuzz_inputs -max_total_time=60 CORPUS_DIR tests/fuzz/inputs
 * FUZZ_INPUTS_VERBOSE=1 prints each open's outcome (the well-formed seeds in tests/fuzz/inputs open;
 * the regression seeds, named after the bug each found, are refused). */
#define PLANRT_INTERNAL
#include "data/data.h"
#include "planrt.h"
#include "planrt_dataset.h"
#include "planrt_namemap.h"
#include "planrt_tokens.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_INPUT = 1 << 20, MAX_ELEMS = 1 << 16, MAX_TOKENS = 4096, VOCAB = 1 << 17 };

static char scratch[256]; /* this process's directory for the files */
static Bpe *trained;      /* the vocabulary of kind 4 */
static char vocab_dir[320]; /* kind 5's vocab.json and merges.txt */
static char set_dir[320];   /* kind 6's data set */

/* kind 7's program: a two-layer Llama's parameters, as examples/llama.plan names them */
#define LAYER(i)                                                                                             \
	{"layers." #i ".llama_block.rmsnorm.weight", 1, {64}, {64}, {-1}, 0, 1, 0, 0},                          \
		{"layers." #i ".llama_block.gqa_attention.wq", 2, {64, 64}, {64, 64}, {-1, -1}, 0, 1, 0, 0},     \
		{"layers." #i ".llama_block.gqa_attention.wk", 2, {64, 32}, {64, 32}, {-1, -1}, 0, 1, 0, 0},     \
		{"layers." #i ".llama_block.gqa_attention.wv", 2, {64, 32}, {64, 32}, {-1, -1}, 0, 1, 0, 0},     \
		{"layers." #i ".llama_block.gqa_attention.wo", 2, {64, 64}, {64, 64}, {-1, -1}, 0, 1, 0, 0},     \
		{"layers." #i ".llama_block.rmsnorm_1.weight", 1, {64}, {64}, {-1}, 0, 1, 0, 0},                 \
		{"layers." #i ".llama_block.swiglu.w_gate", 2, {64, 128}, {64, 128}, {-1, -1}, 0, 1, 0, 0},      \
		{"layers." #i ".llama_block.swiglu.w_up", 2, {64, 128}, {64, 128}, {-1, -1}, 0, 1, 0, 0},        \
		{"layers." #i ".llama_block.swiglu.w_down", 2, {128, 64}, {128, 64}, {-1, -1}, 0, 1, 0, 0}
static const planrt_param_t LLAMA_PARAMS[] = {
	{"wte", 2, {256, 64}, {256, 64}, {-1, -1}, 0, 1, 0, 0}, LAYER(0), LAYER(1),
	{"rmsnorm.weight", 1, {64}, {64}, {-1}, 0, 1, 0, 0}, {"lm_head", 2, {64, 256}, {64, 256}, {-1, -1}, 0, 1, 0, 0},
};
#undef LAYER
static const planrt_program_t llama = {.plan = "fuzz", .model = "llama", .world = 1, .params = LLAMA_PARAMS,
				       .nparams = (int)(sizeof LLAMA_PARAMS / sizeof LLAMA_PARAMS[0])};
static int verbose;       /* FUZZ_INPUTS_VERBOSE set: each open's outcome on stderr (to check seeds) */
static long long inputs, opened; /* how many inputs came, how many of them a reader took (scripts/fuzz.sh) */

static void report_opened(void)
{
	if (inputs)
		fprintf(stderr, "fuzz: inputs that parse: %lld of %lld (%.0f%%)\n", opened, inputs, 100.0 * opened / inputs);
}

/* r, told on stderr under FUZZ_INPUTS_VERBOSE */
static planrt_result_t told(const char *what, planrt_result_t r)
{
	if (verbose)
		fprintf(stderr, "fuzz_inputs: %s: %s\n", what, r == planrt_success ? "opened" : planrt_last_error());
	opened += r == planrt_success;
	return r;
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(scratch, sizeof scratch, "%s/planrt-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(scratch))
		abort();
	verbose = getenv("FUZZ_INPUTS_VERBOSE") != NULL;
	atexit(report_opened);
	static const char corpus[] = "The quick brown fox jumps over the lazy dog. It's 2026; don't we'll see 3.14 "
				     "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac  tabs\tand\nnew lines   ";
	char dir[320], err[512];
	snprintf(dir, sizeof dir, "%s/trained", scratch);
	snprintf(vocab_dir, sizeof vocab_dir, "%s/vocab", scratch);
	snprintf(set_dir, sizeof set_dir, "%s/set", scratch);
	if (mkdir(dir, 0700) || mkdir(vocab_dir, 0700) || mkdir(set_dir, 0700) ||
	    bpe_train(corpus, sizeof corpus - 1, 320, dir, err, sizeof err) ||
	    !(trained = bpe_load(dir, err, sizeof err)))
		abort();
}

/* text through b: encoded, and the ids decoded back to the same bytes (a byte-level BPE loses
 * nothing) */
static void round_trip(const Bpe *b, const char *text, size_t n)
{
	int32_t *ids = NULL;
	size_t len = 0, cap = 0;
	if (bpe_encode(b, text, n, &ids, &len, &cap) < 0)
		abort(); /* out of memory */
	char *back = NULL;
	size_t back_n = 0;
	FILE *out = open_memstream(&back, &back_n);
	if (!out)
		abort();
	int bad = bpe_decode(b, ids, len, out);
	fclose(out);
	if (bad || back_n != n || memcmp(back, text, n))
		abort(); /* the encoder lost or changed bytes */
	free(back);
	free(ids);
}

/* path = scratch/name holding data[0 .. size); the path, or NULL if it could not be written */
static const char *put(const char *name, const uint8_t *data, size_t size, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s", scratch, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return NULL;
	bool ok = size == 0 || write(fd, data, size) == (ssize_t)size;
	close(fd);
	return ok ? path : NULL;
}

/* Two files from one input: its first two bytes give the first file's length (little-endian, at
 * most what follows), the rest is the second; their paths in first and second ([320] each). */
static bool put_pair(const char *a, const char *b, const uint8_t *data, size_t size, char *first, char *second)
{
	if (size < 2)
		return false;
	size_t n = (size_t)data[0] | (size_t)data[1] << 8;
	data += 2, size -= 2;
	n = n < size ? n : size;
	return put(a, data, n, first, 320) && put(b, data + n, size - n, second, 320);
}

static void read_weights(const char *path)
{
	planrt_st_t f;
	if (told("safetensors", planrt_st_open(path, &f)) != planrt_success)
		return;
	static float buf[MAX_ELEMS];
	for (int i = 0; i < planrt_st_count(f); i++) {
		const char *name, *dtype;
		int rank;
		int64_t dims[8], offs[8] = {0};
		const void *data;
		planrt_st_raw(f, i, &name, &dtype, &rank, dims, &data);
		if (rank > 8 || (strcmp(dtype, "F32") && strcmp(dtype, "BF16") && strcmp(dtype, "F16")))
			continue;
		int64_t n = 1;
		for (int d = 0; d < rank && n <= MAX_ELEMS; d++)
			n = dims[d] > 0 && dims[d] <= MAX_ELEMS ? n * dims[d] : dims[d] == 0 ? 0 : MAX_ELEMS + 1;
		if (n <= MAX_ELEMS)
			(void)planrt_st_read_block(f, name, rank, dims, dims, offs, buf);
	}
	planrt_st_close(f);
}

static void read_tokens(const char *path)
{
	planrt_tokens_t *t;
	if (told("tokens", planrt_tokens_open_(path, VOCAB, &t)) != planrt_success)
		return;
	if (verbose)
		fprintf(stderr, "fuzz_inputs: %s, %lld tokens\n", planrt_tokens_format_(t), (long long)planrt_tokens_count_(t));
	static int32_t buf[MAX_TOKENS];
	int64_t count = planrt_tokens_count_(t), n = count < MAX_TOKENS ? count : MAX_TOKENS;
	if (n > 0) {
		planrt_tokens_read_(t, 0, n, buf);
		planrt_tokens_read_(t, count - n, n, buf);
	}
	if (planrt_tokens_documents_(t) > 0)
		for (int64_t k = 0; k < 4 && count > 0; k++)
			(void)planrt_tokens_doc_start_(t, count / 4 * k);
	planrt_tokens_close_(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer calls it */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!scratch[0])
		setup();
	if (size < 1 || size > MAX_INPUT)
		return 0;
	inputs++;
	int kind = data[0] % 8;
	data++, size--;
	char path[320], bin[320];
	switch (kind) {
	case 0:
		if (put("weights.safetensors", data, size, path, sizeof path))
			read_weights(path);
		break;
	case 1:
		if (put_pair("data.idx", "data.bin", data, size, path, bin))
			read_tokens(path);
		break;
	case 2:
		if (put("tokens.bin", data, size, path, sizeof path))
			read_tokens(path);
		break;
	case 3:
		if (put("tokens.txt", data, size, path, sizeof path))
			read_tokens(path);
		break;
	case 4:
		opened++;
		round_trip(trained, (const char *)data, size);
		break;
	case 5: {
		char err[512] = "";
		Bpe *b = put_pair("vocab/vocab.json", "vocab/merges.txt", data, size, path, bin)
				 ? bpe_load(vocab_dir, err, sizeof err)
				 : NULL;
		if (verbose)
			fprintf(stderr, "fuzz_inputs: vocabulary: %s\n", b ? "loaded" : err);
		if (b) {
			opened++;
			round_trip(b, "hello world", 11);
			bpe_free(b);
		}
		break;
	}
	case 6: {
		planrt_dataset_t set;
		if (put("set/x.npy", data, size, path, sizeof path) &&
		    told("npy", planrt_dataset_open(set_dir, &set)) == planrt_success)
			planrt_dataset_close(set);
		break;
	}
	default: {
		planrt_namemap_t map;
		if (put("names.map", data, size, path, sizeof path) &&
		    told("map", planrt_namemap_open(path, &llama, &map)) == planrt_success)
			planrt_namemap_close(map);
		break;
	}
	}
	return 0;
}
