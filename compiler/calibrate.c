/* calibrate.c: `planc calibrate` (issue 20), a device file measured on the machine it runs on.
 *
 *   mpirun -np N planc calibrate -o FILE [--device BASE] [--quick]
 *
 * planrt measures (runtime/driver/calibrate.c: the GEMMs, element-wise bandwidth, fused
 * attention and collectives the generated programs run, on every rank at once, the slowest
 * rank's figures), and this file turns the measurements into the device model explain and search
 * read (--device=FILE): the GEMMs' rates fitted as matmul.* (FLOPs) and matmul_bw.* (operand
 * bytes), the axpy bandwidth as memory.*, the
 * attention rate as attention.*, a tiny kernel's time as kernel.latency, the memory per rank, and each link measured (within a node,
 * between nodes) as its all-reduce bus bandwidth and the one-element all-reduce's time as its
 * latency. What was not measured (the link between nodes on one machine, the tree algorithm)
 * comes from the base device, and the file says which figures those are. The CPU runs bf16 and
 * f16 plans' GEMMs in f32 after casts, so every element type gets the f32 figures.
 *
 * planc is linked with planrt and MPI for `planc run`, which is what lets it measure here; it is
 * built into the planc executable only (the fuzzers and unit tests link the compiler without
 * planrt). The file is written by rank 0 through the output-file rule (planrt_outfile.h), and
 * its path is checked before anything is measured. */
#include "explain/explain.h"
#include "planrt_calibrate.h"
#include "planrt_outfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int calibrate_main(int argc, char **argv);

static const char calibrate_usage[] =
	"usage: mpirun -np N planc calibrate -o FILE [--device BASE] [--quick]\n"
	"  measures this machine with the kernels and collectives planc's programs run, on every rank at\n"
	"  once, and writes a device file for 'planc explain --device=FILE' and 'planc search' (docs/search.md)\n"
	"options:\n"
	"  -o FILE          the device file to write (checked before measuring)\n"
	"  --device BASE    the named device the figures not measured come from (default: cpu)\n"
	"  --quick          small sizes and short timings (seconds, for tests; figures less exact)\n";

static void print_link(FILE *out, const char *what, const planrt_calib_link_t *l)
{
	fprintf(out, "# %s: %d ranks; all-reduce of one float %.3g s; bus bandwidth: all-reduce %.4g (its best size), "
		     "at %.0f MiB reduce-scatter %.4g, all-gather %.4g, send+recv %.4g bytes/s\n",
		what, l->ranks, l->latency, l->allreduce_busbw, l->bytes[l->nsizes - 1] / 1048576.0,
		l->reduce_scatter_busbw, l->allgather_busbw, l->sendrecv_busbw);
	fprintf(out, "#   all-reduce seconds by size:");
	for (int i = 0; i < l->nsizes; i++)
		fprintf(out, " %.0fK %.3g", l->bytes[i] / 1024, l->allreduce_s[i]);
	fprintf(out, "\n");
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* A ring step's seconds: what the all-reduces up to the best size took beyond the one-float
 * latency and their bytes at the best size's bus bandwidth, per ring step (2 (n - 1)), the median
 * over those sizes (0 if none is left over). Open MPI reduces one float by recursive doubling in
 * 15 us on 4 ranks of this project's machine, but 4 KiB-256 KiB took 68-227 us where latency +
 * bytes / bandwidth gives 17-162: priced without it, a tensor-parallel plan with 8 micro-batches
 * (64 KiB all-reduces) was estimated 20% under its measured step. Sizes past the best one are left
 * out: there the bandwidth falls, which the steps do not describe. */
static double ring_hop(const planrt_calib_link_t *l)
{
	if (l->ranks < 2 || l->allreduce_busbw <= 0)
		return 0;
	double n = (double)l->ranks, best = 0, left[PLANRT_CALIB_SIZES];
	int last = -1, m = 0;
	for (int i = 0; i < l->nsizes; i++) {
		double busbw = l->allreduce_s[i] > 0 ? 2 * (n - 1) / n * l->bytes[i] / l->allreduce_s[i] : 0;
		if (busbw > best) {
			best = busbw;
			last = i;
		}
	}
	for (int i = 0; i <= last; i++)
		left[m++] = (l->allreduce_s[i] - l->latency - 2 * (n - 1) / n * l->bytes[i] / l->allreduce_busbw) / (2 * (n - 1));
	if (!m)
		return 0;
	qsort(left, (size_t)m, sizeof left[0], by_value);
	double median = m % 2 ? left[m / 2] : 0.5 * (left[m / 2 - 1] + left[m / 2]);
	return median > 0 ? median : 0;
}

static void take_link(Link *to, const planrt_calib_link_t *l)
{
	*to = (Link){.bw = l->allreduce_busbw, .latency = l->latency, .hop = ring_hop(l), .tree = 0, .tree_hop = 0};
}

/* A GEMM's FLOPs and its operands' bytes (A, B and C once each, f32) for shape i. */
static void gemm_work(const planrt_calibration_t *c, int i, double *flops, double *bytes)
{
	double m = (double)c->gemm_mnk[i][0], n = (double)c->gemm_mnk[i][1], k = (double)c->gemm_mnk[i][2];
	*flops = 2 * m * n * k;
	*bytes = 4 * (m * k + k * n + m * n);
}

/* The GEMM model: seconds = FLOPs / rate + operand bytes / bw, fitted to the shapes measured by
 * least squares of the relative error (two unknowns, 1 / rate and 1 / bw: the normal equations).
 * OpenBLAS copies A and B into packed panels before its products, which a small GEMM (a
 * micro-batch of 64 tokens by D = 128) pays for fewer products: on 4 ranks sharing 2 cores the
 * GPT example's data 2 x pipe 2 plans measured 38.3 ms a step with 1 micro-batch and 42-45 with
 * 8, where FLOPs alone priced them alike (docs/search.md). Where the fit is not two positive
 * rates (a machine whose small shapes are as fast as its large ones, or noise), bw is 0 and rate
 * the best shape's, FLOPs alone. */
static void fit_gemms(const planrt_calibration_t *c, double *rate, double *bw)
{
	double ff = 0, fb = 0, bb = 0, f1 = 0, b1 = 0, best = 0;
	for (int i = 0; i < c->ngemms; i++) {
		double flops, bytes;
		gemm_work(c, i, &flops, &bytes);
		if (c->gemm_rate[i] <= 0)
			continue;
		double t = flops / c->gemm_rate[i], x = flops / t, y = bytes / t; /* each row divided by t */
		ff += x * x, fb += x * y, bb += y * y, f1 += x, b1 += y;
		if (c->gemm_rate[i] > best)
			best = c->gemm_rate[i];
	}
	double det = ff * bb - fb * fb, per_flop = det != 0 ? (f1 * bb - b1 * fb) / det : 0,
	       per_byte = det != 0 ? (ff * b1 - fb * f1) / det : 0;
	if (per_flop > 0 && per_byte > 0 && isfinite(per_flop) && isfinite(per_byte)) {
		*rate = 1 / per_flop;
		*bw = 1 / per_byte;
	} else {
		*rate = best;
		*bw = 0;
	}
}

/* The device model from the measurements, starting from base. */
static Device calibrated_device(const Device *base, const planrt_calibration_t *c, char *name, size_t n)
{
	Device d = *base;
	double rate, bw;
	fit_gemms(c, &rate, &bw);
	for (int t = 0; t < 3; t++) {
		d.matmul[t] = rate;
		d.matmul_bw[t] = bw;
		d.memory_bw[t] = c->memory_bw;
		d.attention[t] = c->attention_rate;
	}
	if (c->capacity > 0)
		d.capacity = c->capacity;
	d.launch = c->launch;
	d.dropout = c->dropout_rate;
	d.attention_score[0] = c->attention_score[0];
	d.attention_score[1] = c->attention_score[1];
	d.attention_tile = c->attention_tile;
	d.node_ranks = c->node_ranks;
	long cores = sysconf(_SC_NPROCESSORS_ONLN); /* this machine's; explain uses it where ranks share them */
	d.node_cores = cores > 0 && cores < c->node_ranks ? (int)cores : 0;
	if (c->node.ranks)
		take_link(&d.node, &c->node);
	if (c->net.ranks)
		take_link(&d.net, &c->net);
	else if (c->node.ranks && c->nodes == 1)
		d.net = d.node; /* one machine: a plan larger than the launch is priced as if on more of it */
	snprintf(name, n, "calibrated on %s (%d ranks, %d per node; planc calibrate)", c->host, c->ranks, c->node_ranks);
	d.name = name;
	d.key = "file";
	return d;
}

/* The file's comments: what was measured and how d (calibrated_device's) was made of it. */
static void write_header(FILE *out, const planrt_calibration_t *c, const Device *d, const Device *base)
{
	time_t now = time(NULL);
	char when[64];
	strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
	fprintf(out, "# measured by planc calibrate on %s at %s, %d ranks (%d nodes of %d), load average %.2f at start\n",
		c->host, when, c->ranks, c->nodes, c->node_ranks, c->load);
	fprintf(out, "# each figure is the slowest rank's while every rank measured at once\n");
	fprintf(out, "# f32 GEMM FLOP/s by shape (M x N x K):");
	for (int i = 0; i < c->ngemms; i++)
		fprintf(out, " %lldx%lldx%lld %.6g", (long long)c->gemm_mnk[i][0], (long long)c->gemm_mnk[i][1],
			(long long)c->gemm_mnk[i][2], c->gemm_rate[i]);
	double rate = d->matmul[0], bw = d->matmul_bw[0];
	if (bw > 0) {
		fprintf(out, "\n# matmul.*, matmul_bw.*: a GEMM's seconds as its FLOPs / matmul + its operands' bytes (A, B, C "
			     "once) / matmul_bw, fitted to these; the fit against each:");
		for (int i = 0; i < c->ngemms; i++) {
			double flops, bytes;
			gemm_work(c, i, &flops, &bytes);
			double t = flops / c->gemm_rate[i];
			fprintf(out, " %+.0f%%", 100 * ((flops / rate + bytes / bw) - t) / t);
		}
	} else {
		fprintf(out, "\n# matmul.*: the best of these (a fit of FLOPs and operand bytes was not two positive rates)");
	}
	fprintf(out, "\n# the CPU runs bf16 and f16 GEMMs in f32 after casts\n");
	fprintf(out, "# kernel.latency: a tiny kernel's seconds per call (a GEMM of 8 x 8 x 8 and an add of 64 floats, the mean)\n");
	fprintf(out, "# dropout.rate: mask elements per second of planrt's dropout over 64 Ki floats (its Philox draws; its bytes are memory.*)\n");
	fprintf(out, "# memory.*: y = a x + y over arrays larger than the caches (64 MiB; 4 MiB with --quick); attention.*: the fused causal attention's products, forward and "
		     "backward, at head dims 16 and 64 (the difference: the products' rate; the rest: each computed score's own "
		     "seconds, attention.score_forward and score_backward), every tile with an unmasked score counted whole (attention.tile)\n");
	if (c->node.ranks)
		print_link(out, "within a node", &c->node);
	if (c->net.ranks)
		print_link(out, "between nodes", &c->net);
	if (!c->node.ranks)
		fprintf(out, "# within a node: not measured (one rank per node), from %s\n", base->key);
	if (!c->net.ranks)
		fprintf(out, "# between nodes: not measured (%s), %s\n", c->nodes == 1 ? "one node" : "one rank",
			c->nodes == 1 && c->node.ranks ? "the link within the node's figures" : "from the base device");
	fprintf(out, "# hop: the all-reduces up to the best size beyond latency + bytes / bandwidth, per ring step (the median); "
		     "not measured, from %s: the tree figures (MPI's algorithms are priced as a ring)\n", base->key);
}

static int write_file(const char *path, const Device *d, const planrt_calibration_t *c, const Device *base)
{
	char why[512];
	planrt_outfile_t f;
	FILE *out;
	if (planrt_outfile_open(&f, "-o", path, (long)getpid(), why, sizeof why) || !(out = planrt_outfile_stream(&f, why, sizeof why))) {
		fprintf(stderr, "planc calibrate: error: %s\n", why);
		return 1;
	}
	write_header(out, c, d, base);
	device_write(out, d);
	if (ferror(out) || planrt_outfile_commit(&f, why, sizeof why)) {
		if (ferror(out))
			snprintf(why, sizeof why, "cannot write %s", path);
		planrt_outfile_discard(&f);
		fprintf(stderr, "planc calibrate: error: %s\n", why);
		return 1;
	}
	return 0;
}

int calibrate_main(int argc, char **argv)
{
	const char *out = NULL, *base_name = "cpu";
	int quick = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(calibrate_usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			if (out) {
				fprintf(stderr, "planc calibrate: -o given twice\n");
				return 2;
			}
			out = argv[++i];
		} else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
			base_name = argv[++i];
		} else if (!strncmp(argv[i], "--device=", 9)) {
			base_name = argv[i] + 9;
		} else if (!strcmp(argv[i], "--quick")) {
			quick = 1;
		} else {
			fprintf(stderr, "planc calibrate: unknown option or missing value '%s'\n%s", argv[i], calibrate_usage);
			return 2;
		}
	}
	if (!out) {
		fprintf(stderr, "planc calibrate: -o FILE is required\n%s", calibrate_usage);
		return 2;
	}
	const Device *base = device_named(base_name);
	if (!base) {
		fprintf(stderr, "planc calibrate: unknown device '%s' for --device (%s)\n", base_name, device_names());
		return 2;
	}
	planrt_calibration_t c;
	char why[512];
	int rank = planrt_calibrate(&c, out, quick, why, sizeof why);
	int status = 0;
	if (rank < 0) {
		fprintf(stderr, "planc calibrate: error: %s\n", why);
		status = 1;
	} else if (rank == 0) {
		static char name[256];
		Device d = calibrated_device(base, &c, name, sizeof name);
		status = write_file(out, &d, &c, base);
		if (!status)
			printf("planc calibrate: wrote %s: matmul %.4g FLOP/s, memory %.4g bytes/s, attention %.4g FLOP/s, "
			       "%.3g s per kernel, link within a node %.4g bytes/s and %.3g s per call (%d ranks)\n",
			       out, d.matmul[0], d.memory_bw[0], d.attention[0], d.launch, d.node.bw, d.node.latency, c.ranks);
	}
	planrt_calibrate_end();
	return status;
}
