/* explain.h: `planc explain`: the cost report (explain.c) and its schedule picture (svg.c), both
 * read off the lowered program that the targets print. */
#ifndef PLANC_EXPLAIN_H
#define PLANC_EXPLAIN_H

#include "target/target.h"

/* explain.c: the cost report, text or JSON, read off the lowered program: its state and arena
 * give the memory lines when planc build can run it, its kernels the communication. */
void explain(FILE *out, Graph *g, bool json, const Lowered *low);
/* svg.c: `planc explain --svg FILE`: each rank role's pipeline schedule (forward, backward, sends,
 * idle time) and memory over one step, from the same estimate as explain's step time, written to
 * out. False when out reports a write error. */
bool explain_svg(FILE *out, Graph *g, const Lowered *low);
const char *explain_device_name(void); /* the description of the device the estimate assumes */

/* device.c: the device models (docs/search.md). A link as nccl-tests measures it: bus bandwidth
 * (bytes/s), latency per call and per ring step; tree: the tree all-reduce's share of the bus
 * bandwidth (0: none) and its latency per tree level. */
typedef struct Link {
	double bw, latency, hop, tree, tree_hop;
} Link;
typedef struct Device {
	const char *key, *name;
	double matmul[3];    /* dense matmul FLOP/s by element type: f32, bf16, f16 */
	double matmul_bw[3]; /* bytes/s at which a GEMM's operands (A, B and C, each once) cost beyond its
			      * FLOPs, by element type (0: its FLOPs alone). A CPU GEMM copies its operands
			      * into packed panels before its products: a micro-batch's small GEMMs spend a
			      * larger share of their time there (planc calibrate fits it) */
	double memory_bw[3]; /* bytes/s element-wise kernels move, by element type */
	double attention[3]; /* FLOP/s of the fused attention's products by element type (0: the matmul rate) */
	double attention_score[2]; /* seconds each score the fused attention computes costs beyond its
				    * products, forward and backward (its row work: exp, max, sum, mask) */
	int attention_tile;  /* the fused attention's query and key tile: under a causal mask every tile
			      * holding an unmasked score is computed whole (0: the unmasked half counted) */
	double capacity;     /* bytes of device memory per rank */
	double launch;       /* seconds every compute kernel costs beyond its roofline (launch, dispatch) */
	double dropout;      /* dropout mask elements drawn per second (a Philox block per 4 elements), beyond
			      * the kernel's bytes; 0: the bytes alone (a GPU draws them at memory speed) */
	int node_ranks;      /* ranks per node */
	int node_cores;      /* cores a node's ranks share, where fewer than its ranks (a CPU; 0: a core or
			      * device each): the rates are a rank's while all of them compute */
	Link node, net;      /* within a node, between nodes */
} Device;
const Device *device_current(void);  /* the device explain assumes (h200 unless chosen) */
void device_use(const Device *d);    /* copies d */
const Device *device_named(const char *key); /* h200, h100, a100, cpu; NULL if none */
const char *device_names(void);
bool device_load(const char *path, Device *d); /* a device file; false after printing why */
void device_write(FILE *out, const Device *d);
bool device_select(const char *arg); /* --device=NAME|FILE; false after printing why */
bool device_parse_number(const char *s, double *out); /* 450G, 10u, 80GiB; false if not one */
/* seconds of a collective moving `wire` ring bytes per rank over n ranks in `steps` ring steps */
double device_collective_seconds(const Link *l, bool all_reduce, long long n, double steps, double wire);
/* the least seconds of that collective however it is split into calls: its bandwidth term */
double device_wire_floor(const Link *l, bool all_reduce, double wire);
const char *explain_bytes(double b, char *buf, size_t n); /* "1.50 MiB", as the report prints sizes */
/* What planc search ranks a plan by: the largest peak memory of a rank role (bytes), the
 * estimated step time and its parts (seconds), the pipeline bubble; runnable: planc build runs
 * it, so the peak is what the program allocates. False when there is no estimate. */
typedef struct ExplainSummary {
	double peak, step, pipeline, update, bubble;
	double params, grads, optim; /* bytes of the rank role with the largest peak */
	double act_micro;            /* its saved activations of one micro-batch (explain's count) */
	bool causal;                 /* the model has a fused causal attention */
	bool runnable;
} ExplainSummary;
bool explain_summary(Graph *g, const Lowered *low, ExplainSummary *out);
/* The estimate's seconds of every program's kernels, summed (search.c's bounds): compute kernels
 * of the forward and backward phases (all micro-batches) and of the update phase; the least
 * seconds (the bandwidth term) of the collectives of the same phases, sends left out. */
typedef struct ExplainTotals {
	double compute, update, comm_micro, comm_step;
} ExplainTotals;
void explain_totals(const Lowered *low, ExplainTotals *out);
/* A one-stage plan's costs (planc search's references) by the part of the model each kernel
 * works for: part 0 before the first layer (the embedding), 1 + l layer l, nlayers + 1 after the
 * last (the head and the loss), where pipeline.c puts them on the first stage, the layer's and the
 * last; a kernel whose part is not certain is in none. Whole-step figures of one rank. */
typedef struct ExplainPart {
	double fwd, bwd;             /* compute seconds of the forward and backward phases */
	double fwd_comm, bwd_comm;   /* least seconds of their collectives (the bandwidth term) */
	double update;               /* compute seconds of the update phase */
	double act;                  /* saved activations, bytes (explain's count, by the reading op) */
	double params, grads, optim; /* model states, bytes */
} ExplainPart;
/* fills out[0 .. nlayers + 2); false (nothing filled) for a plan of several stages or roles */
bool explain_parts(Graph *g, const Lowered *low, ExplainPart *out);
/* The estimate's costs in seconds for the programs of one rank role (RANKROLE_ANY, or an async
 * role): one micro-batch's forward and backward per stage and chunk (fc, bc: [stages * chunks]),
 * the longest transfer between stages, and each stage's update phase (update: [stages]), at the
 * speed the step computes (explain_stage_speed): a plan with fewer ranks on a node than the
 * calibration shared its cores among computes faster throughout, update included.
 * Returns the pipeline simulation's speeds (explain_stage_speeds into speed_buf: [stages + 1]),
 * NULL where its stages do not share cores. What the estimate and the --svg picture simulate. */
const double *explain_step_costs(const Graph *g, const Lowered *low, int role, double *fc, double *bc, double *xfer,
				 double *update, double *speed_buf);
/* How much faster than its estimated cost a pipeline stage computes while `busy` of its `stages`
 * stages do, where the node's ranks share fewer cores than they are (1 where they do not; the
 * most with one busy). explain_stage_speeds: the same for busy = 0..stages into buf, or NULL where
 * every speed is 1 (list scheduling, pipeline.c). */
double explain_stage_speed(long long world, int stages, int busy);
const double *explain_stage_speeds(long long world, int stages, double *buf);

#endif
