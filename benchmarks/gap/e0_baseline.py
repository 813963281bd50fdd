"""E0/E1/E2: small llama-like config: theory vs measured cos, text vs unique ids, rope on/off."""
import time

from common import (
    ids_text,
    ids_unique,
    llama_small,
    measure,
    no_rope,
    theory,
)

T = 256
cfg = llama_small()
t0 = time.time()
txt = ids_text(2, T)
uni = ids_unique(2, T)
res = {}
for name, ids, patch in (("text", txt, None), ("unique", uni, None),
                         ("text_norope", txt, no_rope), ("unique_norope", uni, no_rope)):
    c, _ = measure(cfg, ids, patch=patch)
    res[name] = c
    print(name, f"{time.time()-t0:.0f}s", flush=True)
th_text, spec = theory(cfg, T, res["text"][0])
th_uni, _ = theory(cfg, T, max(res["unique"][0], 0))
print("beta_eff", spec.beta_eff, "sigma_s", spec.sigma_s)
print("layer  th(text rho0)  text  text_norope | th(uni)  unique  unique_norope")
for l in range(len(th_text)):
    print(f"{l:3d}  {th_text[l]:.3f}  {res['text'][l]:.3f}  {res['text_norope'][l]:.3f} | "
          f"{th_uni[l]:.3f}  {res['unique'][l]:.3f}  {res['unique_norope'][l]:.3f}")
