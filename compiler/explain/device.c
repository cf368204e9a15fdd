/* device.c: the device models explain's step-time estimate and planc search assume (issue 20).
 *
 * A device is what one rank runs on: its dense matmul rate and its memory bandwidth per element
 * type (and, optionally, the rate at which a GEMM's operands cost beyond its FLOPs: a CPU GEMM's
 * packing), its memory, a fixed cost per compute kernel (launch and dispatch, which the roofline of a
 * small kernel leaves out), and the two links a collective can cross: within a node and between nodes.
 * A link has the bus bandwidth nccl-tests reports (its "busbw": the algorithm bandwidth times
 * 2 (n - 1) / n for an all-reduce, (n - 1) / n for an all-gather or reduce-scatter, so that one
 * figure serves every group size), a latency per call and one per step of the ring (a ring
 * all-reduce takes 2 (n - 1) steps, an all-gather or reduce-scatter n - 1), and, where the library
 * also runs a tree all-reduce (NCCL's double binary tree), the tree's share of the bus bandwidth
 * and its latency per level (2 log2 n levels, down and up): an all-reduce costs the cheaper.
 *
 * Named devices are nominal data-sheet figures for comparing plans; a device file (the format is
 * below and in docs/search.md; `planc calibrate` writes one from measurements) gives one's own.
 * The file is lines of `key = value`, `#` starts a comment, numbers take an SI suffix (k M G T P
 * for 10^3..10^15, m u n for 10^-3..10^-9, Ki Mi Gi Ti for powers of 1024). */
#include "explain/explain.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A compute kernel's fixed cost beyond its roofline (kernel.latency): on a GPU without CUDA graphs,
 * the launch and the gap between dependent kernels on a stream (a few microseconds); on the CPU,
 * the call through planrt and a small kernel's set-up (OpenBLAS's for a GEMM), as `planc calibrate`
 * measured it on one rank of a 2-core x86-64 machine (docs/search.md). A file may give at most
 * MAX_LAUNCH: more is a unit mistake (5 for 5u). */
#define CPU_LAUNCH 0.1e-6
#define MAX_LAUNCH 1e-3

/* clang-format off */
static const Device builtin[] = {
	{.key = "h200", .name = "H200-class nodes of 8 GPUs (67 TFLOP/s f32, 989 TFLOP/s bf16, 4.8 TB/s memory; 450 GB/s per GPU in a "
		 "node, 50 GB/s between nodes, 10 us per message; 3 us per kernel)",
	 .matmul = {67e12, 989e12, 989e12}, .memory_bw = {4.8e12, 4.8e12, 4.8e12}, .capacity = 141e9, .launch = 3e-6, .node_ranks = 8,
	 .node = {.bw = 450e9, .latency = 10e-6}, .net = {.bw = 50e9, .latency = 10e-6}},
	{.key = "h100", .name = "H100 SXM nodes of 8 GPUs (67 TFLOP/s f32, 989 TFLOP/s bf16, 3.35 TB/s memory, 80 GB; NVLink "
		 "360 GB/s bus bandwidth in a node, 8 x 400 Gb/s InfiniBand between nodes, tree all-reduce between nodes; 3 us per kernel)",
	 .matmul = {67e12, 989e12, 989e12}, .memory_bw = {3.35e12, 3.35e12, 3.35e12}, .capacity = 80e9, .launch = 3e-6, .node_ranks = 8,
	 .node = {.bw = 360e9, .latency = 10e-6, .hop = 1e-6}, .net = {.bw = 45e9, .latency = 10e-6, .hop = 4e-6, .tree = 0.9, .tree_hop = 4e-6}},
	{.key = "a100", .name = "A100 SXM 80GB nodes of 8 GPUs (19.5 TFLOP/s f32, 312 TFLOP/s bf16, 2.0 TB/s memory; NVLink "
		 "230 GB/s bus bandwidth in a node, 8 x 200 Gb/s InfiniBand between nodes, tree all-reduce between nodes; 3 us per kernel)",
	 .matmul = {19.5e12, 312e12, 312e12}, .memory_bw = {2.0e12, 2.0e12, 2.0e12}, .capacity = 80e9, .launch = 3e-6, .node_ranks = 8,
	 .node = {.bw = 230e9, .latency = 10e-6, .hop = 1e-6}, .net = {.bw = 22e9, .latency = 10e-6, .hop = 5e-6, .tree = 0.9, .tree_hop = 5e-6}},
	{.key = "cpu", .name = "one x86-64 core per rank (100 GFLOP/s f32 and bf16, 10 GB/s memory; 5 GB/s and 5 us per message between "
		"ranks of one machine; 0.1 us per kernel)",
	 .matmul = {100e9, 100e9, 100e9}, .memory_bw = {10e9, 10e9, 10e9}, .capacity = 16.0 * (1 << 30), .launch = CPU_LAUNCH, .node_ranks = 1 << 30,
	 .node = {.bw = 5e9, .latency = 5e-6}, .net = {.bw = 5e9, .latency = 5e-6}},
};
/* clang-format on */

static Device current_device;
static bool current_set;

const Device *device_current(void)
{
	if (!current_set) {
		current_device = builtin[0];
		current_set = true;
	}
	return &current_device;
}

void device_use(const Device *d)
{
	current_device = *d;
	current_set = true;
}

const Device *device_named(const char *key)
{
	for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
		if (!strcmp(builtin[i].key, key))
			return &builtin[i];
	return NULL;
}

const char *device_names(void)
{
	return "h200, h100, a100, cpu";
}

/* ---------------------------------------------------------------- collective cost */

/* Seconds one rank spends in a collective moving `wire` bytes (the ring's bytes per rank, as
 * explain counts them) over n ranks on link l; steps: the ring's steps (2 (n - 1) for an
 * all-reduce, n - 1 for a gather or scatter, 1 for a send). */
double device_collective_seconds(const Link *l, bool all_reduce, long long n, double steps, double wire)
{
	if (n <= 1)
		return 0;
	double ring = wire / l->bw + l->latency + steps * l->hop;
	if (!all_reduce || l->tree <= 0)
		return ring;
	double levels = ceil(log2((double)n));
	double tree = wire / (l->bw * l->tree) + l->latency + 2 * levels * l->tree_hop;
	return tree < ring ? tree : ring;
}

double device_wire_floor(const Link *l, bool all_reduce, double wire)
{
	double share = all_reduce && l->tree > 1 ? l->tree : 1;
	return wire / (l->bw * share);
}

/* ---------------------------------------------------------------- device files */

/* A number with an optional SI or binary suffix; false if the text is not one. */
bool device_parse_number(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno)
		return false;
	static const struct {
		const char *suffix;
		double scale;
	} units[] = {{"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}, {"k", 1e3},
		     {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"m", 1e-3}, {"u", 1e-6}, {"n", 1e-9}};
	for (size_t i = 0; *end && i < sizeof units / sizeof units[0]; i++) {
		size_t n = strlen(units[i].suffix);
		if (!strncmp(end, units[i].suffix, n)) {
			v *= units[i].scale;
			end += n;
			break;
		}
	}
	if (*end == 'B') /* 80GiB, 450GB */
		end++;
	while (isspace((unsigned char)*end))
		end++;
	*out = v;
	return *end == 0 && isfinite(v) && v >= 0;
}

/* Where key names a field of d: a pointer to it (NULL for an unknown key). */
static double *device_field(Device *d, const char *key)
{
	static const char *const dtypes[] = {"f32", "bf16", "f16"};
	for (int t = 0; t < 3; t++) {
		if (!strncmp(key, "matmul.", 7) && !strcmp(key + 7, dtypes[t]))
			return &d->matmul[t];
		if (!strncmp(key, "matmul_bw.", 10) && !strcmp(key + 10, dtypes[t]))
			return &d->matmul_bw[t];
		if (!strncmp(key, "memory.", 7) && !strcmp(key + 7, dtypes[t]))
			return &d->memory_bw[t];
		if (!strncmp(key, "attention.", 10) && !strcmp(key + 10, dtypes[t]))
			return &d->attention[t];
	}
	if (!strcmp(key, "memory.capacity"))
		return &d->capacity;
	if (!strcmp(key, "kernel.latency"))
		return &d->launch;
	if (!strcmp(key, "dropout.rate"))
		return &d->dropout;
	if (!strcmp(key, "attention.score_forward"))
		return &d->attention_score[0];
	if (!strcmp(key, "attention.score_backward"))
		return &d->attention_score[1];
	Link *l = !strncmp(key, "node.", 5) ? &d->node : !strncmp(key, "net.", 4) ? &d->net : NULL;
	const char *f = l ? strchr(key, '.') + 1 : "";
	if (!l)
		return NULL;
	if (!strcmp(f, "bandwidth"))
		return &l->bw;
	if (!strcmp(f, "latency"))
		return &l->latency;
	if (!strcmp(f, "hop"))
		return &l->hop;
	if (!strcmp(f, "tree"))
		return &l->tree;
	if (!strcmp(f, "tree_hop"))
		return &l->tree_hop;
	return NULL;
}

static bool file_error(const char *path, int line, const char *msg, const char *arg)
{
	fprintf(stderr, "%s:%d: error: ", path, line);
	fprintf(stderr, msg, arg);
	fputc('\n', stderr);
	return false;
}

/* One `key = value` line into d (name, base and ranks_per_node are not numbers of a field). */
static bool device_line(Device *d, const char *path, int line, char *key, char *value, char *names, size_t cap)
{
	if (!strcmp(key, "name")) {
		snprintf(names, cap, "%s", value);
		d->name = names;
		return true;
	}
	if (!strcmp(key, "base")) {
		const Device *b = device_named(value);
		if (!b)
			return file_error(path, line, "unknown base device '%s' (h200, h100, a100 or cpu)", value);
		*d = *b;
		return true;
	}
	double v;
	if (!device_parse_number(value, &v))
		return file_error(path, line, "'%s' is not a non-negative number (an SI suffix may follow: 450G, 10u, 80Gi)",
				  value);
	if (!strcmp(key, "node.ranks")) {
		if (v < 1 || v > 1 << 30 || v != floor(v))
			return file_error(path, line, "node.ranks is a whole number of ranks, 1 or more, not '%s'", value);
		d->node_ranks = (int)v;
		return true;
	}
	if (!strcmp(key, "node.cores")) {
		if (v > 1 << 30 || v != floor(v))
			return file_error(path, line, "node.cores is a whole number of cores (0: a core or device per rank), not '%s'",
					  value);
		d->node_cores = (int)v;
		return true;
	}
	if (!strcmp(key, "attention.tile")) {
		if (v > 1 << 20 || v != floor(v))
			return file_error(path, line, "attention.tile is a whole number of rows (0: the unmasked half of a causal "
					      "attention counted), not '%s'", value);
		d->attention_tile = (int)v;
		return true;
	}
	if (!strncmp(key, "attention.score_", 16) && v > 1e-6)
		return file_error(path, line, "attention.score_forward and score_backward are seconds per score, at most 1u "
					      "(write 0.8n for 0.8 nanoseconds), not '%s'", value);
	if (!strcmp(key, "kernel.latency") && v > MAX_LAUNCH)
		return file_error(path, line, "kernel.latency is seconds per kernel launch, at most 1m (write 5u for 5 "
					      "microseconds), not '%s'", value);
	double *field = device_field(d, key);
	if (!field)
		return file_error(path, line,
				  "unknown key '%s' (name, base, matmul.f32|bf16|f16, matmul_bw.f32|bf16|f16, memory.f32|bf16|f16, "
				  "attention.f32|bf16|f16, attention.score_forward|score_backward, attention.tile, "
				  "memory.capacity, kernel.latency, dropout.rate, "
				  "node.ranks, node.cores, node|net.bandwidth|latency|hop|tree|tree_hop)",
				  key);
	*field = v;
	return true;
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = 0;
	return s;
}

/* Reads a device file into *d. Every rate must end up positive: a file may start from a named
 * device (`base = h100`) and change some figures, or give them all. */
bool device_load(const char *path, Device *d)
{
	static char names[256];
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "planc: error: cannot read device file '%s': %s\n", path, strerror(errno));
		return false;
	}
	memset(d, 0, sizeof *d);
	d->key = "file";
	d->name = path;
	char buf[1024];
	bool ok = true;
	for (int line = 1; ok && fgets(buf, sizeof buf, f); line++) {
		char *hash = strchr(buf, '#');
		if (hash)
			*hash = 0;
		char *s = trim(buf);
		if (!*s)
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			ok = file_error(path, line, "expected 'key = value', got '%s'", s);
			break;
		}
		*eq = 0;
		ok = device_line(d, path, line, trim(s), trim(eq + 1), names, sizeof names);
	}
	fclose(f);
	if (!ok)
		return false;
	const char *missing = d->matmul[0] <= 0 ? "matmul.f32" : d->matmul[1] <= 0 ? "matmul.bf16" : d->matmul[2] <= 0 ? "matmul.f16"
			      : d->memory_bw[0] <= 0 ? "memory.f32" : d->memory_bw[1] <= 0 ? "memory.bf16"
			      : d->memory_bw[2] <= 0 ? "memory.f16" : d->node_ranks <= 0 ? "node.ranks"
			      : d->node.bw <= 0 ? "node.bandwidth" : d->net.bw <= 0 ? "net.bandwidth" : NULL;
	if (missing) {
		fprintf(stderr, "%s: error: the device has no %s (give it, or start from a named device: base = h100)\n", path,
			missing);
		return false;
	}
	return true;
}

/* Writes d as a device file device_load reads back to the same figures. */
void device_write(FILE *out, const Device *d)
{
	static const char *const dtypes[] = {"f32", "bf16", "f16"};
	fprintf(out, "# planc device file (docs/search.md): rates in FLOP/s and bytes/s, latencies in seconds\n");
	fprintf(out, "name = %s\n", d->name);
	for (int t = 0; t < 3; t++)
		fprintf(out, "matmul.%s = %.6g\n", dtypes[t], d->matmul[t]);
	for (int t = 0; t < 3; t++)
		if (d->matmul_bw[t] > 0)
			fprintf(out, "matmul_bw.%s = %.6g\n", dtypes[t], d->matmul_bw[t]);
	for (int t = 0; t < 3; t++)
		fprintf(out, "memory.%s = %.6g\n", dtypes[t], d->memory_bw[t]);
	for (int t = 0; t < 3; t++)
		if (d->attention[t] > 0)
			fprintf(out, "attention.%s = %.6g\n", dtypes[t], d->attention[t]);
	fprintf(out, "memory.capacity = %.6g\nkernel.latency = %.6g\nnode.ranks = %d\n", d->capacity, d->launch,
		d->node_ranks);
	if (d->node_cores > 0)
		fprintf(out, "node.cores = %d\n", d->node_cores);
	if (d->dropout > 0)
		fprintf(out, "dropout.rate = %.6g\n", d->dropout);
	if (d->attention_score[0] > 0 || d->attention_score[1] > 0)
		fprintf(out, "attention.score_forward = %.6g\nattention.score_backward = %.6g\n", d->attention_score[0],
			d->attention_score[1]);
	if (d->attention_tile > 0)
		fprintf(out, "attention.tile = %d\n", d->attention_tile);
	const Link *links[] = {&d->node, &d->net};
	const char *const link_names[] = {"node", "net"};
	for (int i = 0; i < 2; i++)
		fprintf(out, "%s.bandwidth = %.6g\n%s.latency = %.6g\n%s.hop = %.6g\n%s.tree = %.6g\n%s.tree_hop = %.6g\n",
			link_names[i], links[i]->bw, link_names[i], links[i]->latency, link_names[i], links[i]->hop,
			link_names[i], links[i]->tree, link_names[i], links[i]->tree_hop);
}

/* --device=NAME or --device=FILE: a named device, else a file (one with a '/' or '.' in it). */
bool device_select(const char *arg)
{
	const Device *d = device_named(arg);
	if (d) {
		device_use(d);
		return true;
	}
	if (!strchr(arg, '/') && !strchr(arg, '.')) {
		fprintf(stderr, "planc: error: unknown device '%s' for --device (%s, or a device file)\n", arg, device_names());
		return false;
	}
	Device loaded;
	if (!device_load(arg, &loaded))
		return false;
	static char name[512];
	snprintf(name, sizeof name, "%s", loaded.name);
	loaded.name = name;
	device_use(&loaded);
	return true;
}
