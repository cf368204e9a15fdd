/* kernel_table.h: the kernel table, the one place that says what each kind of loop-level kernel
 * is (lower.h includes it; nothing else does).
 *
 * A row is X(KIND, name, class, cpu function, device function, parameters): the kind's name in
 * dumps and messages, its class (KernelClass), the planrt function the C and LLVM targets call,
 * the planrt_cuda function the CUDA target calls (KDEV(f); KDEV_NOOP: nothing to do on the device;
 * KDEV_HOST: planrt_cuda has none, the kernel runs only where every buffer is in host memory),
 * and the function's parameters in order, each KP(type, name) with a type of KPARAM_TYPES. Rows
 * Y(KIND, name, class) are kinds without a planrt function: fused loops, which the targets print
 * themselves, and opaque ops, which planc build refuses. The order of the rows is the KernelKind
 * numbering, which the program fingerprint hashes: append new kinds before OPAQUE.
 *
 * From the table come: the kinds (K_*), their names, classes and functions (kernels.c); the
 * builders' checks (lower.c: an argument appended where the table has another type is an internal
 * error); named argument access (KARG(k, MATMUL, A)); the verifier's argument checks (verify.c);
 * the LLVM back end's signatures (emit_llvm.c); the CUDA target's device calls (emit_cuda.c); how
 * the C printer prints an integer argument (a planrt enum name, a parameter's or an axis's
 * name); and the compile-time check of every function's prototype against planrt's headers
 * (target/planrt_abi.c). */
#ifndef PLANC_KERNEL_TABLE_H
#define PLANC_KERNEL_TABLE_H

/* The parameter types: T(TYPE, how it is passed: I32, I64, F64 or PTR). target/planrt_abi.c
 * gives each its C type and checks every row's function against planrt's prototype; what may fill
 * a parameter of each type is kernels.c's karg_fits; integers of the enum types are printed by
 * name. */
#define KPARAM_TYPES(T) \
	T(I64, I64)        /* a size, count or offset: an integer, a coordinate expression, a block offset */ \
	T(INT, I32)        /* a small count (ranks, segments, workers) or an index */ \
	T(U64, I64)        /* a key */ \
	T(F64, F64)        /* a float */ \
	T(SCALAR, F64)     /* a buffer's first element times a factor (the device reads the buffer) */ \
	T(DIMS, PTR)       /* an int64 list, or a buffer's block offsets */ \
	T(PERM, PTR)       /* an int list */ \
	T(F32_IN, PTR)     /* buffers of an element type: read, or written (_OUT) */ \
	T(F32_OUT, PTR) \
	T(I32_IN, PTR) \
	T(I32_OUT, PTR) \
	T(U8_OUT, PTR) \
	T(F64_IN, PTR) \
	T(F64_OUT, PTR) \
	T(BF16_IN, PTR) \
	T(F16_IN, PTR) \
	T(IN, PTR)         /* a buffer of any element type, read */ \
	T(OUT, PTR)        /* written */ \
	T(ACC, PTR)        /* a gradient summed over rows into it: stored as the kernel's `acc` (f32 or `storage`) */ \
	T(BUFS, PTR)       /* a list of buffers */ \
	T(DTYPE, I32) \
	T(COMM, PTR)       /* a mesh axis's or a pair group's communicator, or none */ \
	T(REQUEST, PTR)    /* a request handle (stage-wide or the action's slot), or none */ \
	T(BUCKET, PTR)     /* a bucket handle */ \
	T(CTX, PTR)        /* the phase call's context */ \
	T(STEP, I64)       /* the step being trained */ \
	T(STEP_SEED, I64)  /* the step's dropout key */ \
	T(TEXT, PTR)       /* a string constant, for messages */ \
	T(PARAM, I32)      /* an index in the parameter table: PARAM_<name> */ \
	T(AXIS, I32)       /* a mesh axis, AXIS_<name>, or PLANRT_NO_AXIS */ \
	T(OPT, I32)        /* an optimizer: planrt_opt_kind_t */ \
	T(CKPT, I32)       /* a checkpoint tensor: PLANRT_CKPT_*, maybe | PLANRT_CKPT_COPY */ \
	T(UNARY_FN, I32)   /* PLANRT_SIN .. PLANRT_SIGMOID */ \
	T(TRANS, I32)      /* PLANRT_NO_TRANS or PLANRT_TRANS */ \
	T(ACCUMULATE, I32) /* PLANRT_OVERWRITE or PLANRT_ACCUMULATE */ \
	T(FLAG, I32)       /* 0 or 1 */

#define KERNEL_TABLE(X, Y) \
	Y(LOOP, "loop", KC_LOOP) \
	X(MATMUL, "matmul", KC_COMPUTE, planrt_k_matmul_f32, KDEV(planrt_cu_k_matmul_f32), \
	  KP(I64, batch) KP(I64, M) KP(I64, N) KP(I64, K) KP(F32_IN, A) KP(TRANS, trans_a) KP(I64, stride_a) \
	  KP(F32_IN, B) KP(TRANS, trans_b) KP(I64, stride_b) KP(F32_OUT, C) KP(I64, stride_c) \
	  KP(ACCUMULATE, accumulate)) \
	X(PERMUTE, "permute", KC_COMPUTE, planrt_k_permute_f32, KDEV(planrt_cu_k_permute_f32), \
	  KP(INT, rank) KP(DIMS, in_dims) KP(PERM, perm) KP(F32_IN, in) KP(F32_OUT, out)) \
	X(SUM_TO, "sum_to", KC_COMPUTE, planrt_k_sum_to_f32, KDEV(planrt_cu_k_sum_to_f32), \
	  KP(INT, rank) KP(DIMS, dims) KP(F32_IN, in) KP(DIMS, out_strides) KP(F32_OUT, out) \
	  KP(I64, out_elems)) \
	X(SUM_TO_ACC, "sum_to_acc", KC_COMPUTE, planrt_k_sum_to_acc_f32, KDEV(planrt_cu_k_sum_to_acc_f32), \
	  KP(INT, rank) KP(DIMS, dims) KP(F32_IN, in) KP(DIMS, out_strides) KP(F32_OUT, out) \
	  KP(I64, out_elems)) \
	X(DROPOUT, "dropout", KC_COMPUTE, planrt_k_dropout_f32, KDEV(planrt_cu_k_dropout_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(U8_OUT, mask) KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) \
	  KP(INT, rank) KP(DIMS, gdims) KP(DIMS, ldims) KP(DIMS, offs)) \
	X(CAUSAL_MASK, "causal_mask", KC_COMPUTE, planrt_causal_mask_block_f32, KDEV(planrt_cu_causal_mask_block_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, batch) KP(I64, rows) KP(I64, cols) KP(DIMS, offs) KP(INT, rank) \
	  KP(FLAG, gradient)) \
	X(SOFTMAX, "softmax", KC_COMPUTE, planrt_k_softmax_f32, KDEV(planrt_cu_k_softmax_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, rows) KP(I64, cols)) \
	X(SOFTMAX_GRAD, "softmax_grad", KC_COMPUTE, planrt_k_softmax_grad_f32, KDEV(planrt_cu_k_softmax_grad_f32), \
	  KP(F32_IN, y) KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, rows) KP(I64, cols)) \
	X(LAYER_NORM, "layer_norm", KC_COMPUTE, planrt_k_layer_norm_f32, KDEV(planrt_cu_k_layer_norm_f32), \
	  KP(F32_IN, x) KP(F32_IN, w) KP(F32_IN, b) KP(F32_OUT, y) KP(F32_OUT, mean) KP(F32_OUT, rstd) \
	  KP(I64, rows) KP(I64, cols) KP(F64, eps)) \
	X(LAYER_NORM_GRAD, "layer_norm_grad", KC_COMPUTE, planrt_k_layer_norm_grad_f32, KDEV(planrt_cu_k_layer_norm_grad_f32), \
	  KP(F32_IN, x) KP(F32_IN, w) KP(F32_IN, mean) KP(F32_IN, rstd) KP(F32_IN, dy) KP(F32_OUT, dx) \
	  KP(F32_OUT, dw) KP(F32_OUT, db) KP(I64, rows) KP(I64, cols)) \
	X(RMS_NORM, "rms_norm", KC_COMPUTE, planrt_k_rms_norm_f32, KDEV(planrt_cu_k_rms_norm_f32), \
	  KP(F32_IN, x) KP(F32_IN, w) KP(F32_OUT, y) KP(F32_OUT, rstd) KP(I64, rows) KP(I64, cols) \
	  KP(F64, eps)) \
	X(RMS_NORM_GRAD, "rms_norm_grad", KC_COMPUTE, planrt_k_rms_norm_grad_f32, KDEV(planrt_cu_k_rms_norm_grad_f32), \
	  KP(F32_IN, x) KP(F32_IN, w) KP(F32_IN, rstd) KP(F32_IN, dy) KP(F32_OUT, dx) KP(F32_OUT, dw) \
	  KP(I64, rows) KP(I64, cols)) \
	X(EMBED, "embed", KC_COMPUTE, planrt_k_embed_f32, KDEV(planrt_cu_k_embed_f32), \
	  KP(F32_IN, table) KP(I32_IN, ids) KP(F32_OUT, out) KP(I64, ntok) KP(I64, dim) KP(I64, vocab_lo) \
	  KP(I64, vocab_local)) \
	X(EMBED_GRAD, "embed_grad", KC_COMPUTE, planrt_k_embed_grad_f32, KDEV(planrt_cu_k_embed_grad_f32), \
	  KP(I32_IN, ids) KP(F32_IN, dy) KP(F32_OUT, dtable) KP(I64, ntok) KP(I64, dim) KP(I64, vocab_lo) \
	  KP(I64, vocab_local)) \
	X(CROSS_ENTROPY, "cross_entropy", KC_COMPUTE, planrt_cross_entropy_f32, KDEV(planrt_cu_cross_entropy_f32), \
	  KP(F32_IN, logits) KP(I32_IN, targets) KP(F32_OUT, loss) KP(F32_OUT, lse) KP(I64, rows) \
	  KP(I64, cols) KP(I64, vocab_lo) KP(F64, scale) KP(F64_OUT, correct) KP(COMM, vocab_comm) KP(OUT, scratch)) \
	X(CE_GRAD, "cross_entropy_grad", KC_COMPUTE, planrt_k_ce_grad_f32, KDEV(planrt_cu_k_ce_grad_f32), \
	  KP(F32_IN, logits) KP(I32_IN, targets) KP(F32_IN, lse) KP(I64, rows) KP(I64, cols) KP(I64, vocab_lo) \
	  KP(SCALAR, dscale) KP(F32_OUT, dlogits)) \
	X(MOE_ROUTE, "moe_route", KC_COMPUTE, planrt_k_moe_route_f32, KDEV(planrt_cu_k_moe_route_f32), \
	  KP(F32_IN, logits) KP(I64, tokens) KP(I64, experts) KP(I64, top_k) KP(I64, group) KP(I64, capacity) \
	  KP(FLAG, normalize) KP(F32_OUT, gates) KP(I32_OUT, idx) KP(I32_OUT, counts) KP(F64_OUT, stats)) \
	X(MOE_ROUTE_GRAD, "moe_route_grad", KC_COMPUTE, planrt_k_moe_route_grad_f32, KDEV(planrt_cu_k_moe_route_grad_f32), \
	  KP(F32_IN, logits) KP(F32_IN, dgates) KP(I64, tokens) KP(I64, experts) KP(I64, top_k) \
	  KP(FLAG, normalize) KP(F32_OUT, dlogits)) \
	X(MOE_DISPATCH, "moe_dispatch", KC_COMPUTE, planrt_k_moe_dispatch_f32, KDEV(planrt_cu_k_moe_dispatch_f32), \
	  KP(F32_IN, x) KP(I32_IN, idx) KP(I64, tokens) KP(I64, top_k) KP(I64, dim) KP(I64, slots) \
	  KP(F32_OUT, buf)) \
	X(MOE_DISPATCH_GRAD, "moe_dispatch_grad", KC_COMPUTE, planrt_k_moe_dispatch_grad_f32, KDEV(planrt_cu_k_moe_dispatch_grad_f32), \
	  KP(F32_IN, dbuf) KP(I32_IN, idx) KP(I64, tokens) KP(I64, top_k) KP(I64, dim) KP(F32_OUT, dx)) \
	X(MOE_COMBINE, "moe_combine", KC_COMPUTE, planrt_k_moe_combine_f32, KDEV(planrt_cu_k_moe_combine_f32), \
	  KP(F32_IN, buf) KP(F32_IN, gates) KP(I32_IN, idx) KP(I64, tokens) KP(I64, top_k) KP(I64, dim) \
	  KP(F32_OUT, out)) \
	X(MOE_COMBINE_GRAD, "moe_combine_grad", KC_COMPUTE, planrt_k_moe_combine_grad_f32, KDEV(planrt_cu_k_moe_combine_grad_f32), \
	  KP(F32_IN, dout) KP(F32_IN, buf) KP(F32_IN, gates) KP(I32_IN, idx) KP(I64, tokens) KP(I64, top_k) \
	  KP(I64, dim) KP(I64, slots) KP(F32_OUT, dbuf) KP(F32_OUT, dgates)) \
	X(MOE_AUX_LOSS, "moe_aux_loss", KC_COMPUTE, planrt_moe_aux_loss_f32, KDEV(planrt_cu_moe_aux_loss_f32), \
	  KP(F32_IN, logits) KP(I64, tokens) KP(I64, experts) KP(I64, group) KP(F64, scale) KP(F32_OUT, loss)) \
	X(MOE_AUX_LOSS_GRAD, "moe_aux_loss_grad", KC_COMPUTE, planrt_k_moe_aux_loss_grad_f32, KDEV(planrt_cu_k_moe_aux_loss_grad_f32), \
	  KP(F32_IN, logits) KP(I64, tokens) KP(I64, experts) KP(I64, group) KP(SCALAR, dscale) \
	  KP(F32_OUT, dlogits)) \
	X(MOE_Z_LOSS, "moe_z_loss", KC_COMPUTE, planrt_moe_z_loss_f32, KDEV(planrt_cu_moe_z_loss_f32), \
	  KP(F32_IN, logits) KP(I64, tokens) KP(I64, experts) KP(F64, scale) KP(F32_OUT, loss)) \
	X(MOE_Z_LOSS_GRAD, "moe_z_loss_grad", KC_COMPUTE, planrt_k_moe_z_loss_grad_f32, KDEV(planrt_cu_k_moe_z_loss_grad_f32), \
	  KP(F32_IN, logits) KP(I64, tokens) KP(I64, experts) KP(SCALAR, dscale) KP(F32_OUT, dlogits)) \
	X(MOE_METRICS, "moe_metrics", KC_IO, planrt_moe_metrics, KDEV(planrt_cu_moe_metrics), \
	  KP(F64_IN, stats) KP(INT, layers) KP(DIMS, experts)) \
	X(MOE_EXCHANGE, "moe_exchange", KC_COMM, planrt_moe_exchange, KDEV(planrt_cu_moe_exchange), \
	  KP(IN, in) KP(OUT, out) KP(FLAG, to_experts) KP(I32_IN, idx) KP(I64, pairs) KP(I64, experts) \
	  KP(I64, slots) KP(I64, dim) KP(DTYPE, t) KP(COMM, c) KP(OUT, scratch)) \
	X(SLICE_DIM, "slice", KC_COMPUTE, planrt_slice_dim, KDEV(planrt_cu_slice_dim), \
	  KP(IN, in) KP(OUT, out) KP(INT, rank) KP(DIMS, dims) KP(INT, dim) KP(FLAG, mirrored) KP(DTYPE, t) KP(COMM, c)) \
	X(FILL, "fill", KC_COMPUTE, planrt_fill, KDEV(planrt_cu_fill), \
	  KP(OUT, dst) KP(I64, n) KP(DTYPE, t) KP(F64, value)) \
	X(CAST, "cast", KC_COMPUTE, planrt_cast, KDEV(planrt_cu_cast), \
	  KP(IN, src) KP(DTYPE, from) KP(OUT, dst) KP(DTYPE, to) KP(I64, n)) \
	X(ACCUMULATE, "accumulate", KC_COMPUTE, planrt_accumulate, KDEV(planrt_cu_accumulate), \
	  KP(OUT, dst) KP(IN, src) KP(I64, n) KP(DTYPE, t)) \
	X(LOAD_INPUT, "load_input", KC_IO, planrt_load_data, KDEV(planrt_cu_load_data), \
	  KP(CTX, ctx) KP(OUT, dst) KP(INT, input) KP(TEXT, name) KP(DTYPE, t) KP(INT, rank) KP(DIMS, gdims) \
	  KP(DIMS, ldims) KP(DIMS, offs) KP(I64, classes)) \
	X(INIT_PARAM, "init_param", KC_IO, planrt_init_param, KDEV(planrt_cu_init_param), \
	  KP(CTX, ctx) KP(OUT, dst) KP(DTYPE, dtype) KP(PARAM, param) KP(I64, lo) KP(I64, n)) \
	X(SAVE_PARAM, "save_param", KC_IO, planrt_save_param, KDEV(planrt_cu_save_param), \
	  KP(CTX, ctx) KP(IN, src) KP(DTYPE, dtype) KP(PARAM, param) KP(I64, lo) KP(I64, n) \
	  KP(AXIS, shard_axis)) \
	X(CKPT_WRITE, "checkpoint_write", KC_IO, planrt_ckpt_write, KDEV(planrt_cu_ckpt_write), \
	  KP(CTX, ctx) KP(IN, src) KP(DTYPE, dtype) KP(PARAM, param) KP(CKPT, kind) KP(I64, lo) KP(I64, n) \
	  KP(AXIS, shard_axis)) \
	X(CKPT_READ, "checkpoint_read", KC_IO, planrt_ckpt_read, KDEV(planrt_cu_ckpt_read), \
	  KP(CTX, ctx) KP(OUT, dst) KP(DTYPE, dtype) KP(PARAM, param) KP(CKPT, kind) KP(I64, lo) KP(I64, n)) \
	X(CKPT_WRITE_LOCAL, "checkpoint_write_local", KC_IO, planrt_ckpt_write_local, KDEV(planrt_cu_ckpt_write_local), \
	  KP(CTX, ctx) KP(IN, src) KP(DTYPE, dtype) KP(I64, n) KP(INT, id)) \
	X(CKPT_READ_LOCAL, "checkpoint_read_local", KC_IO, planrt_ckpt_read_local, KDEV(planrt_cu_ckpt_read_local), \
	  KP(CTX, ctx) KP(OUT, dst) KP(DTYPE, dtype) KP(I64, n) KP(INT, id)) \
	X(PAIR_COMM, "pair_comm", KC_SETUP, planrt_make_pair_comm, KDEV(planrt_cu_make_pair_comm), \
	  KP(AXIS, axis) KP(INT, a) KP(INT, b) KP(INT, index)) \
	X(OFFLOAD_OPEN, "offload_open", KC_IO, planrt_offload_open, KDEV_HOST, \
	  KP(I64, bytes)) \
	X(OFFLOAD_READ, "offload_read", KC_IO, planrt_offload_read, KDEV_HOST, \
	  KP(OUT, dst) KP(I64, offset) KP(I64, bytes) KP(INT, slot)) \
	X(OFFLOAD_WRITE, "offload_write", KC_IO, planrt_offload_write, KDEV_HOST, \
	  KP(IN, src) KP(I64, offset) KP(I64, bytes) KP(INT, slot)) \
	X(OFFLOAD_WAIT, "offload_wait", KC_IO, planrt_offload_wait, KDEV_HOST, \
	  KP(INT, slot)) \
	X(OFFLOAD_COPY, "offload_copy", KC_IO, planrt_copy, KDEV(planrt_cu_copy), \
	  KP(OUT, dst) KP(IN, src) KP(I64, bytes)) \
	X(SUM_SQUARES, "sum_squares", KC_COMPUTE, planrt_sum_squares_acc, KDEV(planrt_cu_sum_squares_acc), \
	  KP(F64_OUT, acc) KP(IN, x) KP(I64, n) KP(DTYPE, t) KP(F64, weight)) \
	X(SUM_SQUARES_SHARD, "sum_squares_shard", KC_COMPUTE, planrt_sum_squares_shard, KDEV(planrt_cu_sum_squares_shard), \
	  KP(F64_OUT, acc) KP(IN, shard) KP(DTYPE, t) KP(I64, lo) KP(I64, n) KP(INT, nseg) KP(DIMS, seg_off) \
	  KP(DIMS, seg_len) KP(DIMS, replicas)) \
	X(CLIP_COEF, "clip_coef", KC_COMPUTE, planrt_clip_coef, KDEV(planrt_cu_clip_coef), \
	  KP(F64_IN, sumsq) KP(F64_OUT, norm) KP(F64_OUT, coef) KP(F64, max_norm)) \
	X(LOSS_SEED, "loss_seed", KC_COMPUTE, planrt_loss_seed, KDEV(planrt_cu_loss_seed), \
	  KP(CTX, ctx) KP(F32_OUT, dl) KP(F64, per_micro)) \
	X(UNSCALE_CLIP, "unscale_clip", KC_COMPUTE, planrt_unscale_clip_coef, KDEV(planrt_cu_unscale_clip_coef), \
	  KP(CTX, ctx) KP(F64_IN, sumsq) KP(F64_OUT, norm) KP(F64_OUT, coef) KP(F64, max_norm)) \
	X(OPTIMIZER, "optimizer", KC_COMPUTE, planrt_optimizer_step, KDEV(planrt_cu_optimizer_step), \
	  KP(OPT, kind) KP(F64, lr) KP(F64, beta1) KP(F64, beta2) KP(F64, eps) KP(F64, weight_decay) \
	  KP(F64, momentum) KP(I64, warmup) KP(I64, total) KP(F64, min_lr) KP(STEP, step) KP(F32_OUT, param) \
	  KP(IN, grad) KP(DTYPE, gt) KP(F32_OUT, m) KP(F32_OUT, v) KP(I64, n) KP(F64_IN, coef)) \
	X(LOSS_ACCUMULATE, "loss_accumulate", KC_COMPUTE, planrt_loss_accumulate, KDEV(planrt_cu_loss_accumulate), \
	  KP(F64_OUT, acc) KP(F32_IN, loss) KP(F64, scale)) \
	X(ALLREDUCE_DIM, "allreduce", KC_COMM, planrt_allreduce_dim, KDEV(planrt_cu_allreduce_dim), \
	  KP(IN, in) KP(OUT, out) KP(I64, n) KP(DTYPE, t) KP(COMM, c)) \
	X(REDUCE_SCATTER_DIM, "reduce_scatter", KC_COMM, planrt_reduce_scatter_dim, KDEV(planrt_cu_reduce_scatter_dim), \
	  KP(IN, in) KP(OUT, out) KP(INT, rank) KP(DIMS, dims) KP(INT, dim) KP(FLAG, mirrored) KP(DTYPE, t) KP(COMM, c) \
	  KP(OUT, scratch)) \
	X(ALLGATHER_DIM, "allgather", KC_COMM, planrt_allgather_dim, KDEV(planrt_cu_allgather_dim), \
	  KP(IN, in) KP(OUT, out) KP(INT, rank) KP(DIMS, dims) KP(INT, dim) KP(FLAG, mirrored) KP(DTYPE, t) KP(COMM, c) \
	  KP(OUT, scratch)) \
	X(ALLTOALL_DIM, "alltoall", KC_COMM, planrt_alltoall_dim, KDEV(planrt_cu_alltoall_dim), \
	  KP(IN, in) KP(OUT, out) KP(INT, rank) KP(DIMS, dims) KP(INT, from_dim) KP(INT, to_dim) KP(DTYPE, t) \
	  KP(COMM, c) KP(OUT, scratch)) \
	X(ALLREDUCE_INPLACE, "allreduce_inplace", KC_COMM, planrt_allreduce_inplace, KDEV(planrt_cu_allreduce_inplace), \
	  KP(OUT, buf) KP(I64, n) KP(DTYPE, t) KP(COMM, c) KP(REQUEST, req)) \
	X(REDUCE_SCATTER_INPLACE, "reduce_scatter_inplace", KC_COMM, planrt_reduce_scatter_inplace, KDEV(planrt_cu_reduce_scatter_inplace), \
	  KP(OUT, buf) KP(I64, chunk) KP(DTYPE, t) KP(COMM, c) KP(REQUEST, req)) \
	X(ALLGATHER_INPLACE, "allgather_inplace", KC_COMM, planrt_allgather_inplace, KDEV(planrt_cu_allgather_inplace), \
	  KP(OUT, buf) KP(I64, chunk) KP(DTYPE, t) KP(COMM, c) KP(REQUEST, req)) \
	X(ALLGATHER_FLAT, "allgather_flat", KC_COMM, planrt_allgather_flat, KDEV(planrt_cu_allgather_flat), \
	  KP(IN, shard) KP(OUT, full) KP(I64, n) KP(DTYPE, t) KP(COMM, c) KP(OUT, scratch)) \
	X(ALLGATHER_FLAT_START, "allgather_flat_start", KC_COMM, planrt_allgather_flat_start, KDEV(planrt_cu_allgather_flat_start), \
	  KP(REQUEST, req) KP(IN, shard) KP(OUT, full) KP(I64, n) KP(DTYPE, t) KP(COMM, c)) \
	X(BUCKET_ALLREDUCE, "bucket_allreduce", KC_COMM, planrt_bucket_allreduce, KDEV(planrt_cu_bucket_allreduce), \
	  KP(INT, n) KP(BUFS, bufs) KP(DIMS, counts) KP(DTYPE, t) KP(COMM, c) KP(OUT, scratch)) \
	X(BUCKET_RS, "bucket_reduce_scatter", KC_COMM, planrt_bucket_reduce_scatter, KDEV(planrt_cu_bucket_reduce_scatter), \
	  KP(INT, n) KP(BUFS, bufs) KP(DIMS, counts) KP(DTYPE, t) KP(BUFS, shards) KP(DTYPE, shard_t) \
	  KP(ACCUMULATE, accumulate) KP(FLAG, zero_source) KP(COMM, c) KP(OUT, scratch)) \
	X(BUCKET_RS_START, "bucket_reduce_scatter_start", KC_COMM, planrt_bucket_reduce_scatter_start, KDEV(planrt_cu_bucket_reduce_scatter_start), \
	  KP(BUCKET, b) KP(INT, n) KP(BUFS, bufs) KP(DIMS, counts) KP(DTYPE, t) KP(FLAG, zero_source) \
	  KP(COMM, c) KP(OUT, buf)) \
	X(BUCKET_RS_FINISH, "bucket_reduce_scatter_finish", KC_WAIT, planrt_bucket_reduce_scatter_finish, KDEV(planrt_cu_bucket_reduce_scatter_finish), \
	  KP(BUCKET, b) KP(INT, n) KP(DIMS, counts) KP(BUFS, shards) KP(DTYPE, shard_t) \
	  KP(ACCUMULATE, accumulate) KP(COMM, c) KP(OUT, buf)) \
	X(SEND_START, "send", KC_COMM, planrt_p2p_send_start, KDEV(planrt_cu_p2p_send_start), \
	  KP(IN, buf) KP(I64, n) KP(DTYPE, t) KP(INT, peer) KP(INT, channel) KP(REQUEST, req)) \
	X(RECV_START, "recv", KC_COMM, planrt_p2p_recv_start, KDEV(planrt_cu_p2p_recv_start), \
	  KP(OUT, buf) KP(I64, n) KP(DTYPE, t) KP(INT, peer) KP(INT, channel) KP(REQUEST, req)) \
	X(P2P_FINISH, "p2p_finish", KC_WAIT, planrt_p2p_finish, KDEV(planrt_cu_p2p_finish), \
	  KP(CTX, ctx) KP(REQUEST, req)) \
	X(REQUEST_FINISH, "finish", KC_WAIT, planrt_request_finish, KDEV(planrt_cu_request_finish), \
	  KP(REQUEST, req)) \
	X(SCALE_METRIC, "scale_metric", KC_COMPUTE, planrt_scale_metric, KDEV(planrt_cu_scale_metric), \
	  KP(F64_OUT, x) KP(F64, f)) \
	X(LOCAL_AVERAGE, "local_average", KC_COMM, planrt_local_average, KDEV(planrt_cu_local_average), \
	  KP(CTX, ctx) KP(INT, every) KP(OUT, flat) KP(I64, n) KP(DTYPE, t) KP(OUT, params) KP(DTYPE, pt) \
	  KP(F64_IN, loss) KP(F64_OUT, history) KP(COMM, c) KP(INT, outer) KP(F64, outer_lr) \
	  KP(F64, outer_momentum) KP(F32_OUT, anchor) KP(F32_OUT, momentum)) \
	X(ASYNC_PULL, "async_pull", KC_COMM, planrt_async_pull, KDEV(planrt_cu_async_pull), \
	  KP(CTX, ctx) KP(INT, staleness) KP(OUT, params) KP(OUT, inbox) KP(I64, n) KP(DTYPE, t) KP(COMM, c)) \
	X(ASYNC_PUSH, "async_push", KC_COMM, planrt_async_push, KDEV(planrt_cu_async_push), \
	  KP(CTX, ctx) KP(INT, staleness) KP(IN, grads) KP(I64, n) KP(DTYPE, t) KP(OUT, ring) KP(F64_IN, loss) \
	  KP(COMM, c)) \
	X(ASYNC_DRAIN, "async_drain", KC_WAIT, planrt_async_drain, KDEV(planrt_cu_async_drain), \
	  KP(CTX, ctx) KP(OUT, params) KP(OUT, inbox) KP(I64, n) KP(DTYPE, t) KP(COMM, c)) \
	X(ASYNC_POST, "async_post", KC_COMM, planrt_async_post, KDEV(planrt_cu_async_post), \
	  KP(CTX, ctx) KP(OUT, inbox) KP(I64, msg) KP(DTYPE, t) KP(INT, nworkers) KP(COMM, c)) \
	X(ASYNC_GATHER, "async_gather", KC_WAIT, planrt_async_gather, KDEV(planrt_cu_async_gather), \
	  KP(CTX, ctx) KP(INT, staleness) KP(OUT, grads) KP(I64, n) KP(DTYPE, t) KP(IN, inbox) \
	  KP(INT, nworkers) KP(F64_OUT, loss) KP(F64_OUT, versions)) \
	X(ASYNC_PUBLISH, "async_publish", KC_COMM, planrt_async_publish, KDEV(planrt_cu_async_publish), \
	  KP(CTX, ctx) KP(INT, staleness) KP(IN, params) KP(I64, n) KP(DTYPE, t) KP(OUT, ring) \
	  KP(INT, nworkers) KP(COMM, c)) \
	X(COMPRESS_CAST, "compress_cast", KC_COMM, planrt_compress_cast, KDEV(planrt_cu_compress_cast), \
	  KP(F32_OUT, grad) KP(I64, n) KP(DTYPE, wire) KP(F32_OUT, residual) KP(OUT, scratch) KP(I64, chunk) \
	  KP(COMM, c)) \
	X(COMPRESS_TOPK, "compress_topk", KC_COMM, planrt_compress_topk, KDEV(planrt_cu_compress_topk), \
	  KP(F32_OUT, grad) KP(INT, nseg) KP(DIMS, off) KP(DIMS, len) KP(DIMS, k) KP(F32_OUT, residual) \
	  KP(OUT, scratch) KP(COMM, c)) \
	X(COMPRESS_POWERSGD, "compress_powersgd", KC_COMM, planrt_compress_powersgd, KDEV(planrt_cu_compress_powersgd), \
	  KP(F32_OUT, grad) KP(INT, nseg) KP(DIMS, off) KP(DIMS, rows) KP(DIMS, cols) KP(INT, r) \
	  KP(F32_OUT, q) KP(F32_OUT, residual) KP(F32_OUT, scratch) KP(COMM, c)) \
	X(POWERSGD_INIT, "powersgd_init", KC_COMPUTE, planrt_powersgd_init, KDEV(planrt_cu_powersgd_init), \
	  KP(CTX, ctx) KP(F32_OUT, q) KP(I64, n)) \
	X(BMM, "bmm", KC_COMPUTE, planrt_k_bmm_f32, KDEV_HOST, \
	  KP(INT, batch_rank) KP(DIMS, batch_dims) KP(I64, M) KP(I64, N) KP(I64, K) KP(F32_IN, A) \
	  KP(TRANS, trans_a) KP(DIMS, a_strides) KP(F32_IN, B) KP(TRANS, trans_b) KP(DIMS, b_strides) \
	  KP(F32_OUT, C) KP(DIMS, c_strides) KP(ACCUMULATE, accumulate)) \
	X(UNARY, "unary", KC_COMPUTE, planrt_k_unary_f32, KDEV(planrt_cu_k_unary_f32), \
	  KP(UNARY_FN, op) KP(F32_IN, x) KP(F32_OUT, y) KP(I64, n)) \
	X(UNARY_GRAD, "unary_grad", KC_COMPUTE, planrt_k_unary_grad_f32, KDEV(planrt_cu_k_unary_grad_f32), \
	  KP(UNARY_FN, op) KP(F32_IN, x) KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, n)) \
	X(SUM_DIM, "sum_dim", KC_COMPUTE, planrt_k_sum_dim_f32, KDEV_HOST, \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, outer) KP(I64, n) KP(I64, inner) KP(F64, scale)) \
	X(SUM_DIM_GRAD, "sum_dim_grad", KC_COMPUTE, planrt_k_sum_dim_grad_f32, KDEV_HOST, \
	  KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, outer) KP(I64, n) KP(I64, inner) KP(F64, scale)) \
	X(MAX_DIM, "max_dim", KC_COMPUTE, planrt_k_max_dim_f32, KDEV_HOST, \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I32_OUT, argmax) KP(I64, outer) KP(I64, n) KP(I64, inner)) \
	X(MAX_DIM_GRAD, "max_dim_grad", KC_COMPUTE, planrt_k_max_dim_grad_f32, KDEV_HOST, \
	  KP(I32_IN, argmax) KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, outer) KP(I64, n) KP(I64, inner)) \
	X(NARROW, "narrow", KC_COMPUTE, planrt_k_slice_f32, KDEV(planrt_cu_k_slice_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, outer) KP(I64, n) KP(I64, inner) KP(I64, start) KP(I64, len)) \
	X(NARROW_GRAD, "narrow_grad", KC_COMPUTE, planrt_k_slice_grad_f32, KDEV(planrt_cu_k_slice_grad_f32), \
	  KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, outer) KP(I64, n) KP(I64, inner) KP(I64, start) KP(I64, len) \
	  KP(ACCUMULATE, accumulate)) \
	X(REPEAT_KV, "repeat_kv", KC_COMPUTE, planrt_k_repeat_kv_f32, KDEV(planrt_cu_k_repeat_kv_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, outer) KP(I64, heads) KP(I64, n_rep) KP(I64, inner) KP(I64, y_heads) \
	  KP(I64, y_head_lo)) \
	X(REPEAT_KV_GRAD, "repeat_kv_grad", KC_COMPUTE, planrt_k_repeat_kv_grad_f32, KDEV(planrt_cu_k_repeat_kv_grad_f32), \
	  KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, outer) KP(I64, heads) KP(I64, n_rep) KP(I64, inner) KP(I64, y_heads) \
	  KP(I64, y_head_lo)) \
	X(ROPE, "rope", KC_COMPUTE, planrt_k_rope_f32, KDEV(planrt_cu_k_rope_f32), \
	  KP(F32_IN, x) KP(F32_OUT, y) KP(I64, batch) KP(I64, seq) KP(I64, heads) KP(I64, head_dim) \
	  KP(I64, rot_dim) KP(FLAG, heads_first) KP(I32_IN, pos) KP(I64, pos_stride) KP(I64, pos_off) \
	  KP(I64, pos_off2) KP(F64, theta)) \
	X(ROPE_GRAD, "rope_grad", KC_COMPUTE, planrt_k_rope_grad_f32, KDEV(planrt_cu_k_rope_grad_f32), \
	  KP(F32_IN, dy) KP(F32_OUT, dx) KP(I64, batch) KP(I64, seq) KP(I64, heads) KP(I64, head_dim) \
	  KP(I64, rot_dim) KP(FLAG, heads_first) KP(I32_IN, pos) KP(I64, pos_stride) KP(I64, pos_off) \
	  KP(I64, pos_off2) KP(F64, theta)) \
	X(REGRESSION_LOSS, "regression_loss", KC_COMPUTE, planrt_regression_loss_f32, KDEV_HOST, \
	  KP(FLAG, l1) KP(F32_IN, x) KP(F32_IN, target) KP(I64, n) KP(F64, scale) KP(F32_OUT, loss)) \
	X(REGRESSION_LOSS_GRAD, "regression_loss_grad", KC_COMPUTE, planrt_regression_loss_grad_f32, KDEV_HOST, \
	  KP(FLAG, l1) KP(F32_IN, x) KP(F32_IN, target) KP(I64, n) KP(SCALAR, dscale) KP(F32_OUT, dx)) \
	X(CHECK_LABELS, "check_labels", KC_COMPUTE, planrt_check_labels, KDEV(planrt_cu_check_labels), \
	  KP(I32_IN, labels) KP(INT, rank) KP(DIMS, ldims) KP(DIMS, offs) KP(I64, classes) KP(TEXT, what) \
	  KP(STEP, step)) \
	X(NARROW_I32, "narrow_i32", KC_COMPUTE, planrt_narrow_i32, KDEV(planrt_cu_narrow_i32), \
	  KP(I32_IN, x) KP(I32_OUT, y) KP(I64, outer) KP(I64, n) KP(I64, inner) KP(I64, start) KP(I64, len)) \
	X(MATMUL_BF16, "matmul_bf16", KC_COMPUTE, planrt_k_matmul_bf16, KDEV(planrt_cu_k_matmul_bf16), \
	  KP(I64, batch) KP(I64, M) KP(I64, N) KP(I64, K) KP(BF16_IN, A) KP(TRANS, trans_a) KP(I64, stride_a) \
	  KP(BF16_IN, B) KP(TRANS, trans_b) KP(I64, stride_b) KP(OUT, C) KP(DTYPE, c_type) KP(I64, stride_c) \
	  KP(ACCUMULATE, accumulate)) \
	X(ATTENTION, "attention", KC_COMPUTE, planrt_k_attention_f32, KDEV(planrt_cu_k_attention_f32), \
	  KP(F32_IN, q) KP(F32_IN, k) KP(F32_IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(F32_OUT, out) \
	  KP(F32_OUT, lse) KP(INT, rank) KP(DIMS, ldims) KP(I64, kv_heads) KP(I64, sk) KP(F64, scale) \
	  KP(INT, mask_kind) KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) KP(DIMS, gdims) KP(DIMS, offs) \
	  KP(OUT, scratch)) \
	X(ATTENTION_GRAD, "attention_grad", KC_COMPUTE, planrt_k_attention_grad_f32, KDEV(planrt_cu_k_attention_grad_f32), \
	  KP(F32_IN, q) KP(F32_IN, k) KP(F32_IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(F32_IN, out) \
	  KP(F32_IN, lse) KP(F32_IN, dout) KP(F32_OUT, dq) KP(F32_OUT, dk) KP(F32_OUT, dv) KP(INT, rank) \
	  KP(DIMS, ldims) KP(I64, kv_heads) KP(I64, sk) KP(F64, scale) KP(INT, mask_kind) KP(F64, p) \
	  KP(STEP_SEED, seed) KP(U64, key) KP(DIMS, gdims) KP(DIMS, offs) KP(OUT, scratch)) \
	X(RING_ATTENTION, "ring_attention", KC_COMPUTE, planrt_k_ring_attention_f32, KDEV(planrt_cu_k_ring_attention_f32), \
	  KP(F32_IN, q) KP(F32_IN, k) KP(F32_IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(F32_OUT, out) \
	  KP(F32_OUT, lse) KP(INT, rank) KP(DIMS, ldims) KP(I64, kv_heads) KP(I64, sk) KP(F64, scale) \
	  KP(INT, mask_kind) KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) KP(DIMS, gdims) KP(DIMS, offs) \
	  KP(OUT, scratch) KP(I64, coord) KP(INT, step) KP(INT, size) KP(FLAG, mirrored)) \
	X(RING_ATTENTION_GRAD, "ring_attention_grad", KC_COMPUTE, planrt_k_ring_attention_grad_f32, \
	  KDEV(planrt_cu_k_ring_attention_grad_f32), \
	  KP(F32_IN, q) KP(F32_IN, k) KP(F32_IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(F32_IN, out) \
	  KP(F32_IN, lse) KP(F32_IN, dout) KP(F32_OUT, dq) KP(F32_OUT, dk) KP(F32_OUT, dv) KP(INT, rank) \
	  KP(DIMS, ldims) KP(I64, kv_heads) KP(I64, sk) KP(F64, scale) KP(INT, mask_kind) KP(F64, p) \
	  KP(STEP_SEED, seed) KP(U64, key) KP(DIMS, gdims) KP(DIMS, offs) KP(OUT, scratch) KP(I64, coord) \
	  KP(INT, step) KP(INT, size) KP(FLAG, mirrored)) \
	X(RING_SHIFT, "ring_shift", KC_COMM, planrt_ring_shift_start, KDEV(planrt_cu_ring_shift_start), \
	  KP(IN, send) KP(OUT, recv) KP(I64, n) KP(DTYPE, t) KP(COMM, c) KP(INT, tag) KP(REQUEST, send_req) \
	  KP(REQUEST, recv_req)) \
	X(DECODE_ATTENTION, "decode_attention", KC_COMPUTE, planrt_decode_attention_f32, KDEV_HOST, \
	  KP(F32_IN, q) KP(F32_IN, k) KP(F32_IN, v) KP(F32_OUT, kcache) KP(F32_OUT, vcache) KP(F32_OUT, out) \
	  KP(I32_IN, pos) KP(I64, batch) KP(I64, heads) KP(I64, kv_heads) KP(I64, head_dim) KP(I64, tmax) \
	  KP(F64, scale)) \
	X(DECODE_INPUT, "decode_input", KC_IO, planrt_decode_input, KDEV_HOST, \
	  KP(CTX, ctx) KP(I32_OUT, dst) KP(FLAG, position)) \
	X(DECODE_LOGITS, "decode_logits", KC_IO, planrt_decode_logits, KDEV_HOST, \
	  KP(CTX, ctx) KP(F32_IN, logits) KP(I64, vocab)) \
	X(PERMUTE_16, "permute_16", KC_COMPUTE, planrt_k_permute_16, KDEV(planrt_cu_k_permute_16), \
	  KP(INT, rank) KP(DIMS, in_dims) KP(PERM, perm) KP(IN, in) KP(OUT, out)) \
	X(SUM_TO_16, "sum_to_16", KC_COMPUTE, planrt_k_sum_to_16, KDEV(planrt_cu_k_sum_to_16), \
	  KP(INT, rank) KP(DIMS, dims) KP(IN, in) KP(DIMS, out_strides) KP(ACC, out) KP(I64, out_elems) \
	  KP(DTYPE, acc) KP(DTYPE, storage)) \
	X(SUM_TO_ACC_16, "sum_to_acc_16", KC_COMPUTE, planrt_k_sum_to_acc_16, KDEV(planrt_cu_k_sum_to_acc_16), \
	  KP(INT, rank) KP(DIMS, dims) KP(IN, in) KP(DIMS, out_strides) KP(ACC, out) KP(I64, out_elems) \
	  KP(DTYPE, acc) KP(DTYPE, storage)) \
	X(LAYER_NORM_16, "layer_norm_16", KC_COMPUTE, planrt_k_layer_norm_16, KDEV(planrt_cu_k_layer_norm_16), \
	  KP(IN, x) KP(IN, w) KP(IN, b) KP(OUT, y) KP(F32_OUT, mean) KP(F32_OUT, rstd) KP(I64, rows) \
	  KP(I64, cols) KP(F64, eps) KP(DTYPE, storage)) \
	X(LAYER_NORM_GRAD_16, "layer_norm_grad_16", KC_COMPUTE, planrt_k_layer_norm_grad_16, \
	  KDEV(planrt_cu_k_layer_norm_grad_16), \
	  KP(IN, x) KP(IN, w) KP(F32_IN, mean) KP(F32_IN, rstd) KP(IN, dy) KP(OUT, dx) KP(ACC, dw) \
	  KP(ACC, db) KP(I64, rows) KP(I64, cols) KP(DTYPE, acc) KP(DTYPE, storage)) \
	X(RMS_NORM_16, "rms_norm_16", KC_COMPUTE, planrt_k_rms_norm_16, KDEV(planrt_cu_k_rms_norm_16), \
	  KP(IN, x) KP(IN, w) KP(OUT, y) KP(F32_OUT, rstd) KP(I64, rows) KP(I64, cols) KP(F64, eps) \
	  KP(DTYPE, storage)) \
	X(RMS_NORM_GRAD_16, "rms_norm_grad_16", KC_COMPUTE, planrt_k_rms_norm_grad_16, \
	  KDEV(planrt_cu_k_rms_norm_grad_16), \
	  KP(IN, x) KP(IN, w) KP(F32_IN, rstd) KP(IN, dy) KP(OUT, dx) KP(ACC, dw) KP(I64, rows) \
	  KP(I64, cols) KP(DTYPE, acc) KP(DTYPE, storage)) \
	X(ATTENTION_16, "attention_16", KC_COMPUTE, planrt_k_attention_16, KDEV(planrt_cu_k_attention_16), \
	  KP(IN, q) KP(IN, k) KP(IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(OUT, out) KP(F32_OUT, lse) \
	  KP(INT, rank) KP(DIMS, ldims) KP(I64, kv_heads) KP(I64, sk) KP(F64, scale) KP(INT, mask_kind) \
	  KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) KP(DIMS, gdims) KP(DIMS, offs) KP(U8_OUT, scratch) \
	  KP(DTYPE, storage)) \
	X(ATTENTION_GRAD_16, "attention_grad_16", KC_COMPUTE, planrt_k_attention_grad_16, \
	  KDEV(planrt_cu_k_attention_grad_16), \
	  KP(IN, q) KP(IN, k) KP(IN, v) KP(F32_IN, mask) KP(DIMS, mask_strides) KP(IN, out) KP(F32_IN, lse) \
	  KP(IN, dout) KP(OUT, dq) KP(OUT, dk) KP(OUT, dv) KP(INT, rank) KP(DIMS, ldims) KP(I64, kv_heads) \
	  KP(I64, sk) KP(F64, scale) KP(INT, mask_kind) KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) \
	  KP(DIMS, gdims) KP(DIMS, offs) KP(U8_OUT, scratch) KP(DTYPE, storage)) \
	X(CROSS_ENTROPY_16, "cross_entropy_16", KC_COMPUTE, planrt_cross_entropy_16, KDEV(planrt_cu_cross_entropy_16), \
	  KP(IN, logits) KP(I32_IN, targets) KP(F32_OUT, loss) KP(F32_OUT, lse) KP(I64, rows) KP(I64, cols) \
	  KP(I64, vocab_lo) KP(F64, scale) KP(F64_OUT, correct) KP(COMM, vocab_comm) KP(U8_OUT, scratch) \
	  KP(DTYPE, storage)) \
	X(CE_GRAD_16, "cross_entropy_grad_16", KC_COMPUTE, planrt_k_ce_grad_16, KDEV(planrt_cu_k_ce_grad_16), \
	  KP(IN, logits) KP(I32_IN, targets) KP(F32_IN, lse) KP(I64, rows) KP(I64, cols) KP(I64, vocab_lo) \
	  KP(SCALAR, dscale) KP(OUT, dlogits) KP(DTYPE, storage)) \
	X(ROPE_16, "rope_16", KC_COMPUTE, planrt_k_rope_16, KDEV(planrt_cu_k_rope_16), \
	  KP(IN, x) KP(OUT, y) KP(I64, batch) KP(I64, seq) KP(I64, heads) KP(I64, head_dim) KP(I64, rot_dim) \
	  KP(FLAG, heads_first) KP(I32_IN, pos) KP(I64, pos_stride) KP(I64, pos_off) KP(I64, pos_off2) \
	  KP(F64, theta) KP(DTYPE, storage)) \
	X(ROPE_GRAD_16, "rope_grad_16", KC_COMPUTE, planrt_k_rope_grad_16, KDEV(planrt_cu_k_rope_grad_16), \
	  KP(IN, dy) KP(OUT, dx) KP(I64, batch) KP(I64, seq) KP(I64, heads) KP(I64, head_dim) KP(I64, rot_dim) \
	  KP(FLAG, heads_first) KP(I32_IN, pos) KP(I64, pos_stride) KP(I64, pos_off) KP(I64, pos_off2) \
	  KP(F64, theta) KP(DTYPE, storage)) \
	X(EMBED_16, "embed_16", KC_COMPUTE, planrt_k_embed_16, KDEV(planrt_cu_k_embed_16), \
	  KP(IN, table) KP(I32_IN, ids) KP(OUT, out) KP(I64, ntok) KP(I64, dim) KP(I64, vocab_lo) \
	  KP(I64, vocab_local) KP(DTYPE, storage)) \
	X(DROPOUT_16, "dropout_16", KC_COMPUTE, planrt_k_dropout_16, KDEV(planrt_cu_k_dropout_16), \
	  KP(IN, x) KP(OUT, y) KP(U8_OUT, mask) KP(F64, p) KP(STEP_SEED, seed) KP(U64, key) KP(INT, rank) \
	  KP(DIMS, gdims) KP(DIMS, ldims) KP(DIMS, offs) KP(DTYPE, storage)) \
	X(MATMUL_F16, "matmul_f16", KC_COMPUTE, planrt_k_matmul_f16, KDEV(planrt_cu_k_matmul_f16), \
	  KP(I64, batch) KP(I64, M) KP(I64, N) KP(I64, K) KP(F16_IN, A) KP(TRANS, trans_a) KP(I64, stride_a) \
	  KP(F16_IN, B) KP(TRANS, trans_b) KP(I64, stride_b) KP(OUT, C) KP(DTYPE, c_type) KP(I64, stride_c) \
	  KP(ACCUMULATE, accumulate)) \
	Y(OPAQUE, "op", KC_OPAQUE)


#endif
