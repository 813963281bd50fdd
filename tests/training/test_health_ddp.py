"""Attention health under data parallelism: two CPU processes (gloo), the same tiny Llama
(same seed) wrapped in DistributedDataParallel, each rank on a different batch. Each rank also
reads the same forwards with a plain, unreduced AttentionTelemetry; the health's statistics
must be the reduction of those local ones (the largest logit: the maximum over ranks, exactly;
the rest: the mean), every rank must get the same scalars, only rank 0 may keep rows, events
and scalars and call the sinks, and QK-Clip (on the reduced maxima) must leave the two
replicas identical."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch

CFG = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=2, intermediate_size=64, vocab_size=200,
           max_position_embeddings=64, initializer_range=0.3)
STEPS, WORLD, TAU = 2, 2, 5.0
TIMEOUT = 120  # seconds for both ranks (measured: ~1 s once the parent has imported)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    """One data-parallel rank (everything it needs is imported here, for a spawned one)."""
    import torch.distributed as dist

    from sigprop.measurement.telemetry import AttentionTelemetry
    from sigprop.models import loading
    from sigprop.training.health import AttentionHealth

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = loading.model_at_init(loading.load_config(CFG), seed=0,
                                      attn_implementation="sdpa")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)

        def sink(step, frame, scalars):
            with open(os.path.join(out, f"sink{rank}.txt"), "a") as f:
                f.write(f"{step} {len(frame)}\n")

        # the same telemetry settings (rows, seed, steps): the same sampled rows
        health = AttentionHealth(model, rows=4, qk_clip=TAU, sinks=[sink], warn=False)
        local = AttentionTelemetry(model, rows=4)
        g = torch.Generator().manual_seed(100 + rank)  # a different batch on each rank
        got = {"local": [], "scalars": []}
        for step in range(STEPS):
            ids = torch.randint(3, CFG["vocab_size"], (2, 24), generator=g)
            loss = ddp(input_ids=ids).last_hidden_state.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            got["local"].append(local.end_step(step))
            got["scalars"].append(health.after_step(step))
        health.close()
        local.close()
        got.update(rank0=health.rank0, rows=health.rows, events=health.events,
                   history=health.scalars,
                   weights={k: v.detach().clone() for k, v in model.state_dict().items()})
        torch.save(got, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    import torch.multiprocessing as mp

    from sigprop.models import loading

    # fork where there is one: the ranks inherit the imports and transformers' model classes
    # (a spawned rank imports them again: ~10 s each on a loaded 2-core machine); a forked
    # rank runs at one torch thread, as DataLoader workers do
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method == "fork":
        loading.model_at_init(loading.load_config(CFG), seed=0, attn_implementation="sdpa")
    out = tmp_path_factory.mktemp("ddp")
    ctx = mp.start_processes(_worker, args=(WORLD, _free_port(), str(out)), nprocs=WORLD,
                             join=False, start_method=method)
    deadline = time.monotonic() + TIMEOUT
    while not ctx.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT} s")
    got = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return out, got


def test_reduced_stats_are_the_max_and_the_mean_of_the_ranks(ranks):
    _, (r0, r1) = ranks
    reduced = {(row["step"], row["layer"], row["head"], row["observable"]): row["value"]
               for row in r0["rows"]}
    assert {k[0] for k in reduced} == set(range(STEPS))
    differ = 0
    for step in range(STEPS):
        a, b = r0["local"][step], r1["local"][step]
        assert sorted(a) == sorted(b) == [0, 1]
        for layer in a:
            for h in range(CFG["num_attention_heads"]):
                m0, m1 = float(a[layer]["max_logit"][h]), float(b[layer]["max_logit"][h])
                differ += m0 != m1
                assert reduced[(step, layer, h, "max_logit")] == max(m0, m1)  # exactly
                for name in ("entropy", "sink", "sigma_s", "ipr"):
                    want = (float(a[layer][name][h]) + float(b[layer][name][h])) / 2
                    assert reduced[(step, layer, h, name)] == pytest.approx(want, abs=1e-6)
    assert differ > 0  # the ranks did see different batches
    # the scalars every rank returns are the reduced ones
    assert r0["scalars"] == r1["scalars"]
    assert [dict(step=s, **sc) for s, sc in enumerate(r0["scalars"])] == r0["history"]


def test_only_rank_zero_keeps_history_and_calls_sinks(ranks):
    out, (r0, r1) = ranks
    assert r0["rank0"] and not r1["rank0"]
    assert r0["rows"] and r0["events"] and r0["history"]
    assert r1["rows"] == [] and r1["events"] == [] and r1["history"] == []
    assert not (out / "sink1.txt").exists()
    lines = (out / "sink0.txt").read_text().split()
    assert [int(s) for s in lines[::2]] == list(range(STEPS))


def test_qk_clip_keeps_the_replicas_identical(ranks):
    _, (r0, r1) = ranks
    clips = [e for e in r0["events"] if e.kind == "qk_clip"]
    assert clips  # initializer_range 0.3: logits well above tau = 5
    for k, v in r0["weights"].items():
        assert torch.equal(v, r1["weights"][k]), k
