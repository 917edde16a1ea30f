# Device side (issue 48, item 2): time FlashInfer's first top-k/top-p sampling call in a row's venv.
# Run with an empty HOME, with and without a prebuilt module in FlashInfer's AOT folder:
#   HOME=$(mktemp -d) /tmp/row-venv/bin/python bench/flashinfer_first_call.py cold
# (measured on the H100: bench/verl_step/sglang_h100.json, flashinfer_sampler_ahead_of_time)
import time, sys
t0 = time.perf_counter()
import torch, flashinfer.sampling as s
from flashinfer.jit import env
t1 = time.perf_counter()
probs = torch.softmax(torch.randn(8, 32000, device="cuda"), -1)
out = s.top_k_top_p_sampling_from_probs(probs, top_k=50, top_p=0.9)
torch.cuda.synchronize()
t2 = time.perf_counter()
out = s.top_k_top_p_sampling_from_probs(probs, top_k=50, top_p=0.9); torch.cuda.synchronize()
t3 = time.perf_counter()
print(f"{sys.argv[1]}: import {t1-t0:.1f} s, first sampling call {t2-t1:.1f} s, second {1000*(t3-t2):.1f} ms, "
      f"aot_dir {env.FLASHINFER_AOT_DIR} exists={(env.FLASHINFER_AOT_DIR / 'sampling' / 'sampling.so').exists()}, out {tuple(out.shape)}")
