"""torch_attention.py: PyTorch's fused attention (F.scaled_dot_product_attention, causal) timed the way
bench/gpu/attention_rate.cu times planc's: bf16 q, k, v of batch 2 x 16 heads, head dims 64 and 128,
each S given (1024 4096 16384 by default); forward, then forward and backward (the backward's time is
the difference), one call to warm up and then as many as fit in about two seconds, with CUDA events.
FLOPs as FlashAttention counts them (forward 4 S^2 Dh a head, backward 10 S^2 Dh, halved by the
causal mask). Prints one line a shape in attention_rate's format:

    torch attention causal S <S> D <Dh>: fwd <ms> ms <rate> TFLOP/s, bwd <ms> ms <rate> TFLOP/s

usage: torch_attention.py [S ...] [--device cpu]   (cpu: f32 and small S, to check the script; on a
PyTorch before 2.0, without SDPA, the CPU check times the same math written out)
"""
import sys
import time

import torch
import torch.nn.functional as F

BATCH, HEADS = 2, 16


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = "cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu" else "cuda"
    args = [a for a in args if a != "cpu"]
    sizes = [int(a) for a in args] or [1024, 4096, 16384]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is None:  # PyTorch before 2.0 (Debian's, on the build machine)
        if device == "cuda":
            sys.exit("torch_attention: this PyTorch has no F.scaled_dot_product_attention (2.0 or later)")
        sdpa = causal_attention
    torch.manual_seed(0)
    for S in sizes:
        for D in (64, 128):
            q, k, v = (torch.randn(BATCH, HEADS, S, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            dout = torch.randn(BATCH, HEADS, S, D, device=device, dtype=dtype)

            def forward():
                with torch.no_grad():
                    sdpa(q, k, v, is_causal=True)

            def forward_backward():
                out = sdpa(q, k, v, is_causal=True)
                out.backward(dout)

            fwd = time_calls(forward, device)
            both = time_calls(forward_backward, device)
            bwd = both - fwd
            noise = bwd <= 0.05 * both  # the two timings differ by less than their noise
            bwd = both if noise else bwd
            flops = 4.0 * S * S * D * BATCH * HEADS / 2
            print(f"torch attention causal S {S} D {D}: fwd {fwd:.3f} ms {flops / fwd / 1e9:.2f} TFLOP/s, "
                  f"bwd {bwd:.3f} ms {2.5 * flops / bwd / 1e9:.2f} TFLOP/s"
                  + (" (forward and backward together: the forward alone timed as long)" if noise else ""), flush=True)
            del q, k, v, dout


def causal_attention(q, k, v, is_causal=True):
    """what SDPA computes, written out: for checking this script on a PyTorch without SDPA"""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def time_calls(fn, device):
    """milliseconds a call: one to warm up, then about two seconds' worth (1 to 20 calls)"""
    fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        one = start.elapsed_time(end)
    else:
        t0 = time.perf_counter()
        fn()
        one = (time.perf_counter() - t0) * 1e3
    reps = max(1, min(20, int(2000 / one) if one > 0 else 10))
    if device == "cuda":
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


if __name__ == "__main__":
    main()
