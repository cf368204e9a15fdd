/* test_safetensors.c: checkpoints. Round trip through planrt_st_write and planrt_st_read_block
 * (whole tensors and blocks), the writer's layout (sorted keys, 8-byte padding, offsets), a file
 * laid out as Python's safetensors writes it (bytes built here), every malformed-file check
 * with its message, and the atomic write leaving nothing behind when it fails. */
#define PLANRT_INTERNAL /* the half-precision conversions */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "planrt.h"

static char dir[64];

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/planrt_st_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd);
}

static const char *path_of(const char *name)
{
	static char path[4][128];
	static int k;
	k = (k + 1) % 4;
	snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
	return path[k];
}

static void assert_message(const char *needle)
{
	const char *m = planrt_last_error();
	if (!strstr(m, needle))
		fail_msg("error '%s' does not mention '%s'", m, needle);
	assert_null(strchr(m, '\n'));
}

static int count_files(void)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* A safetensors file from a header text (padded with spaces to 8 bytes, as the Python writer
 * does) and data; hlen_override != 0 writes that length instead. */
static const char *make_file(const char *name, const char *header, const void *data, size_t ndata,
			     uint64_t hlen_override)
{
	const char *path = path_of(name);
	size_t h = strlen(header), padded = (h + 7) / 8 * 8;
	uint64_t hl = hlen_override ? hlen_override : padded;
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	for (int i = 0; i < 8; i++)
		fputc((int)(hl >> (8 * i) & 0xff), fp);
	fwrite(header, 1, h, fp);
	for (size_t i = h; i < padded; i++)
		fputc(' ', fp);
	if (ndata)
		fwrite(data, 1, ndata, fp);
	fclose(fp);
	return path;
}

static void test_round_trip(void **state)
{
	float w[12], c = 3.5f;
	uint16_t b[5];
	for (int i = 0; i < 12; i++)
		w[i] = (float)i * 0.5f - 2;
	for (int i = 0; i < 5; i++)
		b[i] = planrt_f32_to_half_((float)i - 1.5f, planrt_bf16);
	planrt_st_tensor_t ts[3] = {
		{"b.weight", planrt_f32, 2, {3, 4}, w, NULL},
		{"a.bias", planrt_bf16, 1, {5}, b, NULL},
		{"c", planrt_f32, 0, {0}, &c, NULL},
	};
	const char *path = path_of("ckpt.safetensors");
	assert_int_equal(planrt_st_write(path, ts, 3), planrt_success);
	assert_int_equal(count_files(), 1); /* no temporary left */

	/* the layout the Python writer produces: sorted keys; data by element size, then name */
	FILE *fp = fopen(path, "rb");
	unsigned char head[8];
	assert_int_equal(fread(head, 1, 8, fp), 8);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | head[i];
	assert_int_equal(hlen % 8, 0);
	char *hdr = calloc(1, hlen + 1);
	assert_int_equal(fread(hdr, 1, hlen, fp), hlen);
	fclose(fp);
	assert_true(hdr[0] == '{');
	char *end = strrchr(hdr, '}');
	for (char *p = end + 1; *p; p++)
		assert_true(*p == ' ');
	assert_true((size_t)(end + 1 - hdr) + 8 > hlen); /* padding below 8 bytes */
	char *pm = strstr(hdr, "\"__metadata__\""), *pa = strstr(hdr, "\"a.bias\""), *pb = strstr(hdr, "\"b.weight\""),
	     *pc = strstr(hdr, "\"c\":");
	assert_true(pm && pa && pb && pc && pm < pa && pa < pb && pb < pc);
	assert_non_null(strstr(hdr, "\"a.bias\":{\"data_offsets\":[52,62],\"dtype\":\"BF16\",\"shape\":[5]}"));
	assert_non_null(strstr(hdr, "\"b.weight\":{\"data_offsets\":[0,48],\"dtype\":\"F32\",\"shape\":[3,4]}"));
	assert_non_null(strstr(hdr, "\"c\":{\"data_offsets\":[48,52],\"dtype\":\"F32\",\"shape\":[]}"));
	assert_non_null(strstr(hdr, "\"format\":\"pt\""));
	free(hdr);

	planrt_st_t f;
	assert_int_equal(planrt_st_open(path, &f), planrt_success);
	float got[12];
	int64_t g2[2] = {3, 4}, z2[2] = {0, 0};
	assert_int_equal(planrt_st_read_block(f, "b.weight", 2, g2, g2, z2, got), planrt_success);
	assert_memory_equal(got, w, sizeof w);
	/* a block: rows 1..2, columns 1..2 */
	int64_t l2[2] = {2, 2}, o2[2] = {1, 1};
	assert_int_equal(planrt_st_read_block(f, "b.weight", 2, g2, l2, o2, got), planrt_success);
	assert_true(got[0] == w[5] && got[1] == w[6] && got[2] == w[9] && got[3] == w[10]);
	int64_t g1[1] = {5}, z1[1] = {0}, l1[1] = {3}, o1[1] = {2};
	assert_int_equal(planrt_st_read_block(f, "a.bias", 1, g1, g1, z1, got), planrt_success);
	for (int i = 0; i < 5; i++)
		assert_true(got[i] == (float)i - 1.5f);
	assert_int_equal(planrt_st_read_block(f, "a.bias", 1, g1, l1, o1, got), planrt_success);
	assert_true(got[0] == 0.5f && got[2] == 2.5f);
	assert_int_equal(planrt_st_read_block(f, "c", 0, NULL, NULL, NULL, got), planrt_success);
	assert_true(got[0] == 3.5f);
	/* missing name, wrong shape, block outside the tensor */
	assert_int_equal(planrt_st_read_block(f, "wte", 2, g2, g2, z2, got), planrt_format_error);
	assert_message("tensor 'wte'");
	assert_message("ckpt.safetensors");
	int64_t g44[2] = {4, 4};
	assert_int_equal(planrt_st_read_block(f, "b.weight", 2, g44, g44, z2, got), planrt_format_error);
	assert_message("tensor 'b.weight'");
	assert_message("has shape [3, 4] but the model expects [4, 4]");
	int64_t bad[2] = {2, 3};
	assert_int_equal(planrt_st_read_block(f, "b.weight", 2, g2, l2, bad, got), planrt_invalid_argument);
	planrt_st_close(f);

	/* duplicate names and unsupported dtypes are refused before anything is written */
	planrt_st_tensor_t dup[2] = {{"x", planrt_f32, 1, {1}, w, NULL}, {"x", planrt_f32, 1, {1}, w, NULL}};
	assert_int_equal(planrt_st_write(path_of("dup.safetensors"), dup, 2), planrt_invalid_argument);
	assert_message("two tensors are named 'x'");
	planrt_st_tensor_t u8[1] = {{"x", planrt_u8, 1, {1}, w, NULL}};
	assert_int_equal(planrt_st_write(path_of("u8.safetensors"), u8, 1), planrt_invalid_argument);
	assert_int_equal(count_files(), 1);
}

/* A file as Python's safetensors (Rust writer) lays it out: __metadata__ first, compact JSON,
 * space padding, data in header order; F16, BF16 and an I64 buffer the model does not read. */
static void test_python_file(void **state)
{
	const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
			     "\"emb\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
			     "\"h\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
			     "\"n\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[22,26]},"
			     "\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[26,42]}}";
	unsigned char data[42];
	float emb[4] = {1.0f, -2.0f, 0.25f, 1e-3f};
	memcpy(data, emb, 16);
	const uint16_t h[3] = {0x3f80, 0xc000, 0x3f00}; /* 1, -2, 0.5 */
	const uint16_t n[2] = {0x3c00, 0xb400};         /* 1, -0.25 */
	memcpy(data + 16, h, 6);
	memcpy(data + 22, n, 4);
	const int64_t pos[2] = {0, 1};
	memcpy(data + 26, pos, 16);
	const char *path = make_file("py.safetensors", header, data, sizeof data, 0);
	planrt_st_t f;
	assert_int_equal(planrt_st_open(path, &f), planrt_success);
	float got[4];
	int64_t g2[2] = {2, 2}, z[2] = {0, 0}, g3[1] = {3}, gn[1] = {2};
	assert_int_equal(planrt_st_read_block(f, "emb", 2, g2, g2, z, got), planrt_success);
	assert_memory_equal(got, emb, 16);
	assert_int_equal(planrt_st_read_block(f, "h", 1, g3, g3, z, got), planrt_success);
	assert_true(got[0] == 1.0f && got[1] == -2.0f && got[2] == 0.5f);
	assert_int_equal(planrt_st_read_block(f, "n", 1, gn, gn, z, got), planrt_success);
	assert_true(got[0] == 1.0f && got[1] == -0.25f);
	assert_int_equal(planrt_st_read_block(f, "pos", 1, gn, gn, z, got), planrt_format_error);
	assert_message("dtype I64");
	planrt_st_close(f);
}

static void expect_refused(const char *name, const char *header, const void *data, size_t ndata, uint64_t hlen,
			   const char *needle)
{
	const char *path = make_file(name, header, data, ndata, hlen);
	planrt_st_t f = (planrt_st_t)1;
	assert_int_equal(planrt_st_open(path, &f), planrt_format_error);
	assert_null(f);
	assert_message(needle);
	assert_message(name);
}

static void test_malformed(void **state)
{
	unsigned char data[64] = {0};
	const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	/* truncated below the length field */
	const char *path = path_of("tiny.safetensors");
	FILE *fp = fopen(path, "wb");
	fwrite("\x10\0\0\0", 1, 4, fp);
	fclose(fp);
	planrt_st_t f;
	assert_int_equal(planrt_st_open(path, &f), planrt_format_error);
	assert_message("truncated (4 bytes)");
	/* header lengths: absurd, and past the end */
	expect_refused("huge.safetensors", ok, data, 8, 1ull << 40, "100 MB");
	expect_refused("long.safetensors", ok, data, 8, 4096, "runs past the end of the file");
	/* not JSON, not an object */
	expect_refused("json.safetensors", "{\"a\":{\"dtype\":\"F32\",", data, 8, 0, "not valid JSON");
	expect_refused("array.safetensors", "[1,2]", data, 8, 0, "not a JSON object");
	expect_refused("dupkey.safetensors",
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		       data, 8, 0, "not valid JSON");
	/* tensors */
	expect_refused("dtype.safetensors", "{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8, 0,
		       "unknown dtype \"F31\"");
	expect_refused("span.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8, 0,
		       "shape [3] of F32 (12 bytes) but its data_offsets [0, 8] span 8 bytes");
	expect_refused("past.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 8, 0,
		       "run past the end of the data (8 bytes)");
	expect_refused("overlap.safetensors",
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		       data, 16, 0, "overlap");
	expect_refused("overlap2.safetensors",
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		       "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
		       "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
		       data, 16, 0, "tensors 'a' and 'c' overlap");
	expect_refused("fields.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", data, 8, 0, "data_offsets");
	expect_refused("negshape.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data, 8,
		       0, "non-negative");
	/* the same file, well formed, is accepted */
	path = make_file("good.safetensors", ok, data, 8, 0);
	assert_int_equal(planrt_st_open(path, &f), planrt_success);
	planrt_st_close(f);
	/* not there, a directory */
	assert_int_equal(planrt_st_open(path_of("none.safetensors"), &f), planrt_io_error);
	assert_message("none.safetensors");
	assert_int_equal(planrt_st_open(dir, &f), planrt_io_error);
	assert_message("not a regular file");
}

/* planrt's checksum catches a flipped data byte. */
static void test_checksum(void **state)
{
	float w[16] = {1, 2, 3};
	planrt_st_tensor_t t = {"w", planrt_f32, 1, {16}, w, NULL};
	const char *path = path_of("sum.safetensors");
	assert_int_equal(planrt_st_write(path, &t, 1), planrt_success);
	FILE *fp = fopen(path, "r+b");
	fseek(fp, -3, SEEK_END);
	fputc(0x55, fp);
	fclose(fp);
	planrt_st_t f;
	assert_int_equal(planrt_st_open(path, &f), planrt_format_error);
	assert_message("checksum");
	unlink(path);
}

/* A write that fails half way (the file size limit stops it) leaves neither the file nor the
 * temporary; an existing checkpoint at the path is left as it was. */
static void test_atomic_write(void **state)
{
	enum { N = 100000 };
	float *w = calloc(N, sizeof *w);
	planrt_st_tensor_t t = {"big", planrt_f32, 1, {N}, w, NULL};
	const char *path = path_of("atomic.safetensors");
	int before = count_files();
	signal(SIGXFSZ, SIG_IGN);
	struct rlimit old, lim;
	getrlimit(RLIMIT_FSIZE, &old);
	lim = old;
	lim.rlim_cur = 50000;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	planrt_result_t r = planrt_st_write(path, &t, 1);
	setrlimit(RLIMIT_FSIZE, &old);
	assert_int_equal(r, planrt_io_error);
	assert_message("cannot write checkpoint");
	assert_int_equal(count_files(), before);
	assert_int_equal(access(path, F_OK), -1);

	/* an older checkpoint survives a failed overwrite */
	planrt_st_tensor_t small = {"small", planrt_f32, 1, {4}, w, NULL};
	assert_int_equal(planrt_st_write(path, &small, 1), planrt_success);
	setrlimit(RLIMIT_FSIZE, &lim);
	r = planrt_st_write(path, &t, 1);
	setrlimit(RLIMIT_FSIZE, &old);
	assert_int_equal(r, planrt_io_error);
	assert_int_equal(count_files(), before + 1);
	planrt_st_t f;
	assert_int_equal(planrt_st_open(path, &f), planrt_success);
	float got[4];
	int64_t g[1] = {4}, z[1] = {0};
	assert_int_equal(planrt_st_read_block(f, "small", 1, g, g, z, got), planrt_success);
	planrt_st_close(f);

	/* a directory that does not exist */
	assert_int_equal(planrt_st_write("/nonexistent/dir/x.safetensors", &small, 1), planrt_io_error);
	assert_message("/nonexistent/dir/x.safetensors");
	free(w);
}

static void test_half_conversions(void **state)
{
	static const struct {
		float x;
		uint16_t f16, bf16;
	} cases[] = {
		{0.0f, 0x0000, 0x0000},        {-0.0f, 0x8000, 0x8000},    {1.0f, 0x3c00, 0x3f80},
		{-2.0f, 0xc000, 0xc000},       {65504.0f, 0x7bff, 0x4780}, {65520.0f, 0x7c00, 0x4780},
		{0x1p-24f, 0x0001, 0x3380},    {0x1p-14f, 0x0400, 0x3880}, {0x1.ffcp-15f, 0x0400, 0x3880},
		{1.0f + 0x1p-11f, 0x3c00, 0x3f80}, {1.0f + 0x1.8p-11f, 0x3c01, 0x3f80}, {INFINITY, 0x7c00, 0x7f80},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		assert_int_equal(planrt_f32_to_half_(cases[i].x, planrt_f16), cases[i].f16);
		assert_int_equal(planrt_f32_to_half_(cases[i].x, planrt_bf16), cases[i].bf16);
	}
	/* bf16 rounds to nearest even */
	assert_int_equal(planrt_f32_to_half_(1.0f + 0x1p-8f, planrt_bf16), 0x3f80);
	assert_int_equal(planrt_f32_to_half_(1.0f + 0x1.8p-8f, planrt_bf16), 0x3f81);
	assert_true(isnan(planrt_half_to_f32_(planrt_f32_to_half_(NAN, planrt_bf16), planrt_bf16)));
	assert_true(isnan(planrt_half_to_f32_(planrt_f32_to_half_(NAN, planrt_f16), planrt_f16)));
	/* every finite f16 survives f16 -> f32 -> f16 */
	for (uint32_t h = 0; h < 0x10000; h++) {
		if ((h & 0x7c00) == 0x7c00)
			continue;
		float x = planrt_half_to_f32_((uint16_t)h, planrt_f16);
		assert_int_equal(planrt_f32_to_half_(x, planrt_f16), h);
		float y = planrt_half_to_f32_((uint16_t)h, planrt_bf16);
		if (!isnan(y))
			assert_int_equal(planrt_f32_to_half_(y, planrt_bf16), h);
	}
	assert_true(planrt_half_to_f32_(0x0001, planrt_f16) == 0x1p-24f);
	assert_true(planrt_half_to_f32_(0x7bff, planrt_f16) == 65504.0f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_python_file),
		cmocka_unit_test(test_malformed),   cmocka_unit_test(test_checksum),
		cmocka_unit_test(test_atomic_write), cmocka_unit_test(test_half_conversions),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
