"""Hypothesis strategies for the CLI fuzz suite (tests/test_fuzz_cli.py, issue 13 item 5).

Every command line is a small VALID base (cheap to run: depth <= 3, d_model <= 32, T <= 32,
<= 2 seeds/sequences, <= 3 training steps, a tiny config.json for diagnose/fix) with 0-3
mutations: an option set to a bad or edge value (wrong type, out of range, non-finite, huge,
empty, bad choice, bad list, bad path) or a structural slip (unknown option, missing value).
The oracle is the CLI contract, not a model of which values are valid, so the strategies do
not need to know the bounds.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st

# ---- value pools ---------------------------------------------------------------------------
BAD_INTS = ["-1", "0", "-0", "1", "-5", "99999999999", str(2**63), str(2**64), "-" + str(2**64),
            "1e308", "1e3", "nan", "inf", "-inf", "", "abc", "2.5", "0x10", "1__0",
            "9_999_999_999_999", " 2", "+3", "2^4", "٣"]
BAD_FLOATS = ["-1", "0", "-0", "-0.0", "1e308", "-1e308", "1e400", "nan", "-nan", "NaN", "inf",
              "-inf", "Infinity", "", "abc", "1e-320", "5e-324", "1e-9", "1e9", "2**64", "1,5",
              "0x1p3", str(2**64), " 1", "1_0"]
BAD_CHOICES = ["", "abc", "POST", "Softmax", "none ", "gelu_new", "log_n", "rms,pre", "-", "None"]
BAD_FLOAT_LISTS = ["1 2", "a,b", "", ",", "1,,2", "nan", "inf", "-1", "0", "1e400", "1;2", "1,nan",
                   "-inf,1", " ", "1e308", "1,abc"]
BAD_LENGTH_LISTS = ["a,b", "1 2", "", ",", "1,,2", "2^31", "2^64", "2^1000", "2^-1", "2^0", "0",
                    "1", "-4", "2^", "^2", "2^3^2", "16.5", "nan", "inf", "1e3", "99999999999",
                    "2^2.5", "16,abc", "٣٢"]
OVERLONG = "a" * 300

# spec options shared by every architecture command: name -> kind
SPEC_KINDS = {
    "--depth": "int", "--d-model": "int", "--heads": "int", "--d-ff": "int", "--seq-len": "int",
    "--norm": "choice", "--ln-kind": "choice", "--attention": "choice", "--beta": "float",
    "--qk-std": "float", "--scaling": "choice", "--scaling-param": "float",
    "--alpha-attn": "float", "--alpha-mlp": "float", "--init-std": "float",
    "--sigma-v2": "float", "--sigma-w2": "float", "--sigma-w2-out": "float",
    "--sigma-o2": "float", "--sigma-b2": "float", "--activation": "choice", "--causal": "flag",
    "--rho0": "float", "--rho-max": "float", "--seed": "int", "--format": "choice",
}
NORMS = ["post", "pre", "none"]
LN_KINDS = ["rms", "layernorm"]
ATTENTIONS = ["softmax", "centred", "uniform"]
SCALINGS = ["none", "log-n", "qwen", "ssmax", "yarn", "tau"]
ACTIVATIONS = ["relu", "gelu", "tanh", "silu", "linear", "swiglu"]

# command-specific options: name -> kind
OWN_KINDS = {
    "predict": {"--asymptotic": "flag"},
    "translate": {},
    "diagram": {"--out": "figure", "--grid": "int", "--beta-max": "float",
                "--alpha-max": "float", "--asymptotic": "flag"},
    "measure": {"--seeds": "int", "--sequences": "int", "--input": "choice", "--plot": "figure",
                "--grads": "flag", "--float64": "flag", "--asymptotic": "flag",
                "--no-timing": "flag"},
    "longctx": {"--lengths": "lengths", "--queries": "int", "--chunk": "int",
                "--input": "choice", "--compare": "flag", "--plot": "figure",
                "--no-timing": "flag"},
    "train": {"--steps": "int", "--task": "choice", "--data": "data", "--documents": "int",
              "--vocab-size": "int", "--batch-size": "int", "--lr": "float",
              "--warmup-ratio": "float", "--weight-decay": "float", "--max-grad-norm": "float",
              "--eval-every": "int", "--measure-every": "int", "--seeds": "int",
              "--attention-only": "flag", "--tie": "flag", "--bias-init": "choice",
              "--device": "choice", "--threads": "int", "--plot": "figure",
              "--checkpoint": "dir", "--no-timing": "flag"},
    "trainability": {"--betas": "floats", "--alphas": "floats", "--steps": "int",
                     "--seeds": "int", "--batch-size": "int", "--lr": "float",
                     "--margin": "float", "--bias-init": "choice", "--data": "data",
                     "--device": "choice", "--threads": "int", "--plot": "figure"},
    "diagnose": {"--seq-len": "int", "--seeds": "int", "--sequences": "int",
                 "--device": "choice", "--report": "report", "--format": "choice",
                 "--seed": "int", "--no-timing": "flag"},
    "fix": {"--out": "dir", "--beta": "float", "--alpha-attn": "alpha", "--centred": "flag",
            "--scaling": "choice", "--scaling-param": "float", "--seq-len": "int",
            "--seeds": "int", "--sequences": "int", "--device": "choice", "--report": "report",
            "--format": "choice", "--seed": "int", "--no-timing": "flag"},
}
SPEC_COMMANDS = ("predict", "diagram", "translate", "measure", "longctx", "train", "trainability")

VALID_CHOICES = {
    "--norm": NORMS, "--ln-kind": LN_KINDS, "--attention": ATTENTIONS, "--scaling": SCALINGS,
    "--activation": ACTIVATIONS, "--format": ["json", "table", "csv"],
    "--task": ["mlm", "clm", "reverse", "heaviside"], "--bias-init": ["unigram", "zero"],
    "--device": ["cpu", "cuda", "cuda:0", "cuda:99", "tpu", "cpu:0"],
}
MEASURE_INPUTS = ["rho", "isometric", "text"]
LONGCTX_INPUTS = ["rho", "isometric", "rem"]


# Causal finite-T theory builds tables that take seconds per parameter set: in the hot loop
# --causal comes only with --asymptotic (commands that have it), never for the others; the
# finite-T causal paths have their own few-example test.
ASYMPTOTIC_COMMANDS = ("predict", "diagram", "measure")


def kinds(command: str) -> dict[str, str]:
    own = OWN_KINDS[command]
    own = {**own, "--wide": "flag"}  # every command has it (table output only)
    if command not in SPEC_COMMANDS:
        return own
    spec = {k: v for k, v in SPEC_KINDS.items()
            if k != "--causal" or command in ASYMPTOTIC_COMMANDS}
    return {**spec, **own}


# ---- files the strategies refer to (made once per session by the test module) -------------
class Paths:
    """Temporary files and folders: tiny valid configs, broken configs, bad path targets."""

    def __init__(self, root: Path):
        self.root = root
        self.valid_configs: list[str] = []
        self.broken_configs: dict[str, str] = {}  # path -> the field it breaks
        root.mkdir(parents=True, exist_ok=True)
        (root / "a_dir").mkdir(exist_ok=True)
        (root / "no_config").mkdir(exist_ok=True)
        (root / "text.txt").write_text("once upon a time there was a cat . " * 40)
        (root / "empty.txt").write_text("")
        good = {
            "bert": {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4,
                     "num_hidden_layers": 2, "intermediate_size": 32, "vocab_size": 100,
                     "max_position_embeddings": 64, "pad_token_id": 0},
            "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2,
                     "n_inner": 32, "vocab_size": 100, "n_positions": 64,
                     "bos_token_id": 0, "eos_token_id": 0},
            "llama": {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "num_hidden_layers": 2,
                      "intermediate_size": 32, "vocab_size": 100,
                      "max_position_embeddings": 64, "hidden_act": "silu",
                      "bos_token_id": 1, "eos_token_id": 2},
        }
        for name, cfg in good.items():
            p = root / f"{name}.json"
            p.write_text(json.dumps(cfg))
            self.valid_configs.append(str(p))
        folder = root / "bert_folder"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(good["bert"]))
        self.valid_configs.append(str(folder))
        bert, gpt2, llama = good["bert"], good["gpt2"], good["llama"]
        broken = {
            "heads_not_dividing": ({**bert, "hidden_size": 30}, "hidden_size"),
            "heads_zero": ({**bert, "num_attention_heads": 0}, "num_attention_heads"),
            "heads_neg": ({**llama, "num_attention_heads": -4}, "num_attention_heads"),
            "vocab_zero": ({**bert, "vocab_size": 0}, "vocab_size"),
            "vocab_neg": ({**gpt2, "vocab_size": -1}, "vocab_size"),
            "hidden_abc": ({**bert, "hidden_size": "abc"}, "hidden_size"),
            "hidden_zero": ({**llama, "hidden_size": 0}, "hidden_size"),
            "hidden_null": ({**bert, "hidden_size": None}, "hidden_size"),
            "layers_float": ({**bert, "num_hidden_layers": 2.5}, "num_hidden_layers"),
            "layers_zero": ({**llama, "num_hidden_layers": 0}, "num_hidden_layers"),
            "layers_huge": ({**bert, "num_hidden_layers": 10**12}, "num_hidden_layers"),
            "gpt2_layers_str": ({**gpt2, "n_layer": "2"}, "n_layer"),
            "gpt2_heads_not_dividing": ({**gpt2, "n_head": 5}, "n_head"),
            "kv_not_dividing": ({**llama, "num_key_value_heads": 3}, "num_key_value_heads"),
            "kv_zero": ({**llama, "num_key_value_heads": 0}, "num_key_value_heads"),
            "kv_more": ({**llama, "num_key_value_heads": 8}, "num_key_value_heads"),
            "kv_str": ({**llama, "num_key_value_heads": "two"}, "num_key_value_heads"),
            "intermediate_zero": ({**bert, "intermediate_size": 0}, "intermediate_size"),
            "init_nan": ({**bert, "initializer_range": float("nan")}, "initializer_range"),
            "init_neg": ({**bert, "initializer_range": -1.0}, "initializer_range"),
            "act_unknown": ({**bert, "hidden_act": "nope"}, "hidden_act"),
            "model_type_unknown": ({**bert, "model_type": "nope"}, "model_type"),
            "model_type_missing": ({k: v for k, v in bert.items() if k != "model_type"},
                                   "model_type"),
            "eps_neg": ({**llama, "rms_norm_eps": -1.0}, "rms_norm_eps"),
        }
        for name, (cfg, field) in broken.items():
            p = root / f"broken_{name}.json"
            # allow_nan: json.dumps writes NaN for the init_nan case, as a sloppy tool might
            p.write_text(json.dumps(cfg))
            self.broken_configs[str(p)] = field
        for name, text in (("not_json", "{not json"), ("list_json", "[1, 2]"),
                           ("empty_json", ""), ("null_json", "null")):
            p = root / f"{name}.json"
            p.write_text(text)
            self.broken_configs[str(p)] = "model"

    def bad_figures(self) -> list[str]:
        r = self.root
        return [str(r / "x.xyz"), "/sys/x.png", str(r / "a_dir"), "", str(r / (OVERLONG + ".png")),
                str(r / "missing_dir" / "x.png"), str(r / "x"), "/proc/x.png",
                str(r / "text.txt" / "x.png")]

    def good_figures(self) -> list[str]:
        return [str(self.root / "fig.png"), str(self.root / "fig.svg"),
                str(self.root / "fig.pdf")]

    def bad_dirs(self) -> list[str]:
        r = self.root
        return ["", "/sys/x", "/proc/x", str(r / OVERLONG), str(r / "text.txt"),
                str(r / "text.txt" / "sub"), "/"]

    def good_dir(self) -> str:
        return str(self.root / "out_dir")

    def bad_models(self) -> list[str]:
        r = self.root
        return ["", "nonexistent-model", str(r / "nope.json"), str(r / "no_config"),
                str(r / "text.txt"), "/sys", "/proc/self/status", OVERLONG,
                "bert-base-uncased/../gpt2", "-"] + list(self.broken_configs)


# ---- value strategies per kind --------------------------------------------------------------
def edge_value(name: str, kind: str, command: str, paths: Paths) -> st.SearchStrategy:
    """A bad or edge value for option ``name`` (an argv string, or True for a flag)."""
    if kind == "flag":
        return st.just(True)
    if kind == "int":
        # small (cheap if valid), non-positive, or far beyond any sane bound: never a valid
        # but expensive size (depth 631 x 631 sequences is legal and just slow)
        return st.one_of(st.sampled_from(BAD_INTS),
                         st.integers(-(2**70), 4).map(str),
                         st.integers(2**40, 2**70).map(str))
    if kind == "float":
        return st.one_of(st.sampled_from(BAD_FLOATS),
                         st.floats(allow_nan=True, allow_infinity=True).map(repr))
    if kind == "choice":
        if name == "--input":
            return st.sampled_from(BAD_CHOICES + MEASURE_INPUTS + LONGCTX_INPUTS)
        return st.sampled_from(BAD_CHOICES + VALID_CHOICES.get(name, []))
    if kind == "floats":
        return st.one_of(st.sampled_from(BAD_FLOAT_LISTS),
                         st.lists(st.sampled_from(["0", "1", "-1", "nan", "1e9", "abc", ""]),
                                  min_size=1, max_size=3).map(",".join))
    if kind == "lengths":
        return st.one_of(st.sampled_from(BAD_LENGTH_LISTS),
                         st.lists(st.sampled_from(["2", "16", "0", "-1", "2^31", "x"]),
                                  min_size=1, max_size=3).map(",".join))
    if kind == "figure":
        return st.sampled_from(paths.bad_figures() + paths.good_figures())
    if kind == "report":
        return st.sampled_from(paths.bad_figures() + [str(paths.root / "r.html")])
    if kind == "dir":
        return st.sampled_from(paths.bad_dirs())
    if kind == "data":
        return st.sampled_from(["", "nope", str(paths.root / "missing.txt"),
                                str(paths.root / "empty.txt"), str(paths.root / "a_dir"),
                                "/proc/self/status", "/sys", OVERLONG,
                                str(paths.root / "text.txt")])
    if kind == "alpha":
        return st.sampled_from(BAD_FLOATS + ["auto", "AUTO", "0.5", "1e5"])
    raise AssertionError(kind)


# ---- small valid bases --------------------------------------------------------------------
@st.composite
def spec_base(draw, *, max_depth=3, max_d=32, max_t=32, sim=False) -> dict:
    """Small valid spec options, covering the edge cases (T = 2, depth 1, heads = d_model,
    beta 0, alpha 0, rho0 1) and every norm / LN kind / attention / scaling / activation."""
    # finite-T theory tables are built per (T, d_head) and cached for the session: few
    # distinct T and head widths keep the hot loop cheap (d_head in {1, 4, 8})
    d_model, heads = draw(st.sampled_from([(8, 1), (8, 2), (8, 8), (16, 4), (16, 16),
                                           (32, 4), (32, 32)][:5 if max_d < 32 else 7]))
    opts: dict = {"--depth": str(draw(st.integers(1, max_depth))),
                  "--d-model": str(d_model), "--heads": str(heads),
                  "--seq-len": str(draw(st.sampled_from([2, 8, max_t])))}
    norm = draw(st.sampled_from(NORMS))
    opts["--norm"] = norm
    if draw(st.booleans()):
        opts["--ln-kind"] = draw(st.sampled_from(LN_KINDS))
    if draw(st.booleans()):
        opts["--attention"] = draw(st.sampled_from(ATTENTIONS))
    if draw(st.booleans()):
        opts["--activation"] = draw(st.sampled_from(ACTIVATIONS))
    if draw(st.booleans()):
        opts["--scaling"] = draw(st.sampled_from(SCALINGS))
    if draw(st.booleans()):
        opts["--beta"] = draw(st.sampled_from(["0", "0.5", "1", "3", "8"]))
    if draw(st.booleans()):
        opts["--alpha-attn"] = draw(st.sampled_from(["0", "0.5", "1", "2"]))
    if draw(st.booleans()):
        opts["--alpha-mlp"] = draw(st.sampled_from(["0", "1"]))
    if draw(st.booleans()):
        opts["--rho0"] = draw(st.sampled_from(["0", "0.5", "1"]))
    if draw(st.booleans()):
        opts["--d-ff"] = draw(st.sampled_from(["1", "8", "32"]))
    if draw(st.booleans()):
        opts["--sigma-b2"] = draw(st.sampled_from(["0", "0.1"]))
    return opts


def _model_commands_base(draw, command: str, paths: Paths) -> tuple[list[str], dict]:
    model = draw(st.sampled_from(paths.valid_configs))
    opts = {"--seq-len": draw(st.sampled_from(["2", "8", "16"])), "--seeds": "1",
            "--sequences": draw(st.sampled_from(["1", "2"])), "--format": "json"}
    if command == "fix":
        opts["--out"] = paths.good_dir()
        which = draw(st.sampled_from(["--beta", "--alpha-attn", "--centred", "--scaling"]))
        opts[which] = {"--beta": "1", "--alpha-attn": draw(st.sampled_from(["auto", "0.5"])),
                       "--centred": True, "--scaling": draw(st.sampled_from(SCALINGS[1:]))}[which]
    return [model], opts


@st.composite
def base_command(draw, command: str, paths: Paths) -> tuple[list[str], dict]:
    """(positional args, {option: value}) for a small valid run of ``command``."""
    if command in ("diagnose", "fix"):
        return _model_commands_base(draw, command, paths)
    if command in ("predict", "diagram", "translate"):
        opts = draw(spec_base())
        if command != "translate" and draw(st.booleans()):
            opts["--asymptotic"] = True
            if draw(st.booleans()):
                opts["--causal"] = True
        if command == "diagram":
            opts["--grid"] = str(draw(st.integers(2, 6)))
    elif command == "measure":
        opts = draw(spec_base(max_depth=2, max_d=16, max_t=16, sim=True))
        opts |= {"--seeds": draw(st.sampled_from(["1", "2"])),
                 "--sequences": draw(st.sampled_from(["1", "2"])),
                 "--input": draw(st.sampled_from(MEASURE_INPUTS))}
        if draw(st.booleans()):
            opts["--asymptotic"] = True
    elif command == "longctx":
        opts = draw(spec_base(max_depth=1, max_d=16, max_t=16, sim=True))
        opts |= {"--lengths": draw(st.sampled_from(["16", "2,16", "2^4,32", "3"])),
                 "--queries": draw(st.sampled_from(["1", "4"])),
                 "--chunk": draw(st.sampled_from(["16", "32"])),
                 "--input": draw(st.sampled_from(LONGCTX_INPUTS))}
    elif command == "train":
        opts = draw(spec_base(max_depth=2, max_d=16, max_t=16, sim=True))
        opts |= {"--steps": str(draw(st.integers(1, 3))), "--batch-size": "2",
                 "--task": draw(st.sampled_from(["mlm", "clm", "reverse", "heaviside"])),
                 "--vocab-size": "100", "--documents": "20"}
    elif command == "trainability":
        opts = draw(spec_base(max_depth=1, max_d=16, max_t=8, sim=True))
        opts |= {"--steps": "1", "--batch-size": "2", "--betas": "1", "--alphas": "1"}
    else:
        raise AssertionError(command)
    opts["--format"] = "json"
    return [], opts


@st.composite
def command_line(draw, command: str, paths: Paths, max_mutations: int = 3) -> list[str]:
    """A fuzzed argv for ``command``: a small valid base plus 0..max_mutations mutations."""
    pos, opts = draw(base_command(command, paths))
    table = kinds(command)
    tail: list[str] = []
    for _ in range(draw(st.integers(0, max_mutations))):
        what = draw(st.sampled_from(["value"] * 8 + ["model", "unknown", "novalue"]))
        if what == "model" and command in ("diagnose", "fix"):
            pos = [draw(st.sampled_from(paths.bad_models()))]
        elif what == "unknown":
            tail = ["--bogus-option", "1"]
        elif what == "novalue":
            name = draw(st.sampled_from(sorted(n for n, k in table.items() if k != "flag")))
            opts.pop(name, None)
            tail = [name]  # an option with its value missing, at the very end
        else:
            name = draw(st.sampled_from(sorted(table)))
            opts[name] = draw(edge_value(name, table[name], command, paths))
    if opts.get("--causal") and command in ASYMPTOTIC_COMMANDS:
        opts["--asymptotic"] = True
    argv = [command, *pos]
    for name, value in opts.items():
        if value is True:
            argv.append(name)
        else:
            argv += [name, value]
    return argv + tail
