/* generate.c: `PROG --generate TEXT`, a trained decoder continuing a prompt (docs/generate.md).
 *
 * A program built with `planc build --generate` carries a second program, the model's decode
 * program (compiler/graph/decode.c): one token of one sequence per call of its forward, each layer's
 * keys and values kept in caches across calls. This file runs it: the weights from --init (a
 * safetensors file: what --save writes, or PyTorch's), a checkpoint (--resume: a --save-every
 * directory of any plan of the model) or drawn from --seed as training would draw them; the prompt's bytes as tokens (the byte-level models' encoding); the prompt fed one token per
 * step (prefill through the decode step: O(t) each, the cache filled as it goes), then max-tokens new
 * tokens, each drawn by planrt_sample_token (greedy by default; --temperature, --top-k, the run's
 * Philox --seed) from the logits the step left in ctx->decode_logits. Every rank runs the same steps
 * (the decode program is replicated) and draws the same tokens; rank 0 prints the continuation. */
#include "driver.h"
#include "planrt_kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_options {
	const char *prompt, *init, *resume, *logits_path;
	int64_t max_tokens, top_k;
	double temperature;
	uint64_t seed;
	int print_ids;
} gen_options_t;

int planrt_generate_wanted_(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--generate"))
			return 1;
	return 0;
}

static const char *value_of(int argc, char **argv, int *i)
{
	if (*i + 1 >= argc)
		planrt_fatal("%s needs a value; usage: PROG --generate TEXT [--max-tokens N] [--temperature T] [--top-k K] "
			     "[--seed S] [--init W.safetensors]",
			     argv[*i]);
	return argv[++*i];
}

static double number_of(const char *opt, const char *v, double lo, int integer)
{
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	if (errno || end == v || *end || x < lo || (integer && x != (double)(int64_t)x))
		planrt_fatal("%s needs %s >= %g, not '%s'", opt, integer ? "an integer" : "a number", lo, v);
	return x;
}

static void parse(int argc, char **argv, gen_options_t *o)
{
	*o = (gen_options_t){.max_tokens = 32, .seed = PLANRT_DEFAULT_SEED};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--generate"))
			o->prompt = value_of(argc, argv, &i);
		else if (!strcmp(a, "--max-tokens"))
			o->max_tokens = (int64_t)number_of(a, value_of(argc, argv, &i), 1, 1);
		else if (!strcmp(a, "--temperature"))
			o->temperature = number_of(a, value_of(argc, argv, &i), 0, 0);
		else if (!strcmp(a, "--top-k"))
			o->top_k = (int64_t)number_of(a, value_of(argc, argv, &i), 0, 1);
		else if (!strcmp(a, "--seed"))
			o->seed = (uint64_t)number_of(a, value_of(argc, argv, &i), 0, 1);
		else if (!strcmp(a, "--init"))
			o->init = value_of(argc, argv, &i);
		else if (!strcmp(a, "--resume"))
			o->resume = value_of(argc, argv, &i);
		else if (!strcmp(a, "--logits"))
			o->logits_path = value_of(argc, argv, &i);
		else if (!strcmp(a, "--print-ids"))
			o->print_ids = 1;
		else
			planrt_fatal("%s does not apply to --generate (its options: --max-tokens N --temperature T --top-k K "
				     "--seed S --init W.safetensors --resume CKPT --print-ids --logits FILE)",
				     a);
	}
}

/* The prompt's bytes as tokens, checked against the vocabulary and the context. */
static int32_t *prompt_tokens(const gen_options_t *o, const planrt_program_t *train, int64_t *n)
{
	*n = (int64_t)strlen(o->prompt);
	if (*n == 0)
		planrt_fatal("--generate: the prompt is empty; give the text to continue (--generate \"Once upon\")");
	if (*n + o->max_tokens > train->seq)
		planrt_fatal("--generate: a prompt of %lld tokens and --max-tokens %lld need %lld positions, more than the "
			     "model's context of %lld; shorten the prompt or lower --max-tokens to %lld",
			     (long long)*n, (long long)o->max_tokens, (long long)(*n + o->max_tokens), (long long)train->seq,
			     (long long)(train->seq - *n > 0 ? train->seq - *n : 0));
	if (train->vocab > 256) /* its ids are not bytes: a byte would silently be another token */
		planrt_fatal("--generate: this model's vocabulary has %lld tokens, not the 256 bytes --generate reads a "
			     "prompt as and prints tokens as; a model trained on tokenized data (planc data tokenize) "
			     "cannot take a text prompt yet (docs/generate.md): train it on bytes (V = 256) to generate",
			     (long long)train->vocab);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)*n);
	if (!ids)
		planrt_fatal("out of memory for the prompt");
	for (int64_t i = 0; i < *n; i++) {
		ids[i] = (unsigned char)o->prompt[i];
		if (ids[i] >= train->vocab)
			planrt_fatal("--generate: byte %lld of the prompt (0x%02x) is token %d, outside the model's vocabulary of "
				     "%lld tokens; the prompt is read as bytes, one token each",
				     (long long)i, ids[i], ids[i], (long long)train->vocab);
	}
	return ids;
}

void planrt_decode_input(planrt_ctx_t *ctx, int32_t *dst, int position)
{
	dst[0] = position ? ctx->decode_position : ctx->decode_token;
}

void planrt_decode_logits(planrt_ctx_t *ctx, const float *logits, int64_t vocab)
{
	if (vocab != ctx->decode_vocab)
		planrt_fatal("generation: the decode program's logits have %lld classes, the model's vocabulary %lld",
			     (long long)vocab, (long long)ctx->decode_vocab);
	memcpy(ctx->decode_logits, logits, sizeof(float) * (size_t)vocab);
}

/* the weights: --init, or drawn from the seed as training draws them; then the parameters of the
 * checkpoint --resume names (a --save-every directory or one step-N of it, written under any plan of
 * the model: read as a resharding resume reads it) over them */
static void load_weights(planrt_ctx_t *ctx, const planrt_stage_t *stage, const gen_options_t *o, int rank)
{
	if (o->init && o->resume)
		planrt_fatal("--generate takes the weights from --init or from --resume, not both");
	if (o->init)
		PLANRT_CHECK(planrt_st_open(o->init, &ctx->init_file));
	stage->init(ctx);
	planrt_st_close(ctx->init_file);
	ctx->init_file = NULL;
	if (!o->resume)
		return;
	ctx->ckpt = planrt_ckpt_resume_open(o->resume, ctx->program, 0);
	stage->resume(ctx);
	planrt_ckpt_close(ctx->ckpt);
	ctx->ckpt = NULL;
	if (rank == 0)
		fprintf(stderr, "planrt: generating from the checkpoint '%s'\n", o->resume);
}

static void emit_token(const gen_options_t *o, int32_t t, int rank)
{
	if (rank != 0)
		return;
	if (o->print_ids)
		printf("%d ", t);
	else if (t < 256)
		putchar(t);
	else
		printf("<%d>", t);
	fflush(stdout);
}

int planrt_generate_(int argc, char **argv, const planrt_program_t *train)
{
	gen_options_t o;
	parse(argc, argv, &o);
	const planrt_program_t *p = train->decode;
	if (!p)
		planrt_fatal("--generate: this program was built without its decode program; rebuild it with planc build "
			     "%s --plan %s --generate -o PROG",
			     train->source, train->plan);
	int64_t nprompt;
	int32_t *prompt = prompt_tokens(&o, train, &nprompt);
	int rank, world;
	planrt_start_world_(&argc, &argv, p, &rank, &world);
	planrt_check_program_(p, 0);
	const planrt_stage_t *stage = &p->stages[0];
	holdings_t held = {.state_bytes = 0};
	planrt_stage_allocate_(stage, &held);
	float *logits = malloc(sizeof(float) * (size_t)train->vocab);
	FILE *dump = o.logits_path && rank == 0 ? fopen(o.logits_path, "wb") : NULL;
	if (!logits || (o.logits_path && rank == 0 && !dump))
		planrt_fatal("--logits: cannot write '%s'", o.logits_path ? o.logits_path : "");
	planrt_ctx_t ctx = {.seed = o.seed, .eval_batch = -1, .loss_scale = 1.0, .program = p, .arena = held.arena,
			    .slot = held.arena + stage->slot_offset, .reqs = held.reqs, .decode_logits = logits,
			    .decode_vocab = train->vocab};
	load_weights(&ctx, stage, &o, rank);
	int32_t token = prompt[0];
	for (int64_t t = 0; t < nprompt + o.max_tokens - 1; t++) {
		ctx.decode_token = t < nprompt ? prompt[t] : token;
		ctx.decode_position = (int32_t)t;
		stage->forward[0](&ctx);
		if (t < nprompt - 1)
			continue; /* prefill: the prompt's keys and values into the caches */
		if (dump && fwrite(logits, sizeof(float), (size_t)train->vocab, dump) != (size_t)train->vocab)
			planrt_fatal("--logits: writing '%s' failed", o.logits_path);
		token = planrt_sample_token(logits, train->vocab, o.temperature, o.top_k, o.seed, (uint64_t)(t - nprompt + 1));
		emit_token(&o, token, rank);
	}
	if (rank == 0 && !o.print_ids)
		putchar('\n');
	if (dump && fclose(dump) != 0)
		planrt_fatal("--logits: writing '%s' failed", o.logits_path);
	free(logits);
	free(prompt);
	planrt_stage_release_(stage, &held);
	PLANRT_CHECK(planrt_finalize());
	return 0;
}
