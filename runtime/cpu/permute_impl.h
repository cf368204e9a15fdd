/* permute_impl.h: the permute kernel, included once per element type (no include guard): by
 * kernels_impl.h for each of its instantiations (f32, f64), and by kernels.c for 2-byte elements
 * (planrt_k_permute_16: bf16 and f16 moved as they are stored, K_PERMUTE_16 of lower.c). The
 * includer defines T, FN(name) and KLEVEL, and provides KView, kfatal and kstrides (kernels.c). A
 * permute only moves values, so every instantiation gives the bits the f32 one gives on the values
 * widened (the 2-byte one keeps a NaN's payload, which narrowing would make the quiet NaN). */
void FN(planrt_k_permute)(int rank, const int64_t *in_dims, const int *perm, const T *in, T *out)
{
	KLEVEL(planrt_k_permute, (rank, in_dims, perm, in, out));
	int64_t ist[KMAX_RANK], odims[KMAX_RANK], ost[KMAX_RANK], pst[KMAX_RANK];
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("permute rank out of range");
	kstrides(rank, in_dims, ist);
	for (int d = 0; d < rank; d++) {
		odims[d] = in_dims[perm[d]];
		pst[d] = ist[perm[d]];
	}
	kstrides(rank, odims, ost);
	KView v;
	kview_init(&v, rank, odims, 2, ost, pst, NULL);
	if (v.total == 0)
		return;
	int64_t n = v.dims[v.rank - 1], is = v.st[1][v.rank - 1];
	for (int64_t done = 0; done < v.total; done += n) {
		const T *restrict x = in + v.off[1];
		T *restrict o = out + v.off[0];
		if (is == 1) /* (a loop: rows of a head's few elements cost memcpy more in calls than copies) */
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i];
		else
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i * is];
		kview_next(&v);
	}
}

