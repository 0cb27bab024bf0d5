#!/usr/bin/env python3
"""Writes the pi0 / pi0.5 golden fixtures under tests/fixtures/ with lerobot's own code.

Run by hand (CI uses the committed fixtures):

    tools/golden/setup.sh                       # once: Python 3.12 venv with pinned lerobot
    ~/venvs/golden/bin/python tools/make_golden.py

Tiny models are built by lerobot's classes with random weights (seeded): three module globals
of lerobot.policies.pi0.modeling_pi0 (and pi05) are replaced so the same graph is built with
small widths and depths. Nothing is fetched from any hub. The real pi0 head layout (8 query
heads, 1 KV head) is kept; head counts that shapes cannot tell go to arch.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file, save_model

import lerobot.policies.pi0.modeling_pi0 as pi0_mod
import lerobot.policies.pi05.modeling_pi05 as pi05_mod
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.common.vla_utils import resize_with_pad_torch
from lerobot.policies.pi0.configuration_pi0 import PI0Config
from lerobot.policies.pi0.modeling_pi0 import PI0Policy
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies.pi_gemma import (
    PaliGemmaForConditionalGenerationWithPiGemma as RealPaliGemma,
    PiGemmaForCausalLM as RealPiGemma,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures"

# Tiny shapes. Both transformers share depth, heads, KV heads and head dim (the expert attends to
# the language model's KV cache layer by layer); lerobot hard-codes 8 query heads.
VOCAB = 320
LM = dict(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
EXPERT = dict(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=16)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
ARCH = {"vision_heads": VISION["num_attention_heads"], "heads": 8, "kv_heads": 1, "head_dim": 16}
ROBOT_DIM = 7


def tiny_gemma_config(variant: str):
    spec = LM if variant == "gemma_2b" else EXPERT
    return pi0_mod.GemmaConfig(**spec)


class TinyPaliGemma(RealPaliGemma):
    def __init__(self, config):
        for k, v in VISION.items():
            setattr(config.vision_config, k, v)
        config.vision_config.projection_dim = LM["width"]
        config.projection_dim = LM["width"]
        config.text_config.vocab_size = VOCAB
        config._vocab_size = VOCAB
        config.vocab_size = VOCAB
        config.image_token_index = VOCAB - 1
        super().__init__(config=config)


class TinyPiGemma(RealPiGemma):
    def __init__(self, config, **kwargs):
        config.vocab_size = VOCAB
        super().__init__(config, **kwargs)


for mod in (pi0_mod, pi05_mod):
    mod.get_gemma_config = tiny_gemma_config
    mod.PaliGemmaForConditionalGenerationWithPiGemma = TinyPaliGemma
    mod.PiGemmaForCausalLM = TinyPiGemma


def features(cameras: int):
    inputs = {
        f"observation.images.cam{i}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224))
        for i in range(cameras)
    }
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(ROBOT_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ROBOT_DIM,))}
    return inputs, outputs


def build(kind: str, dtype: str, seed: int):
    torch.manual_seed(seed)
    inputs, outputs = features(3)
    if kind == "pi0":
        cfg = PI0Config(dtype=dtype, device="cpu", input_features=inputs, output_features=outputs)
        policy = PI0Policy(cfg)
    else:
        cfg = PI05Config(dtype=dtype, device="cpu", input_features=inputs, output_features=outputs)
        policy = PI05Policy(cfg)
    # Random init leaves some weights at exactly 0 or 1 (norms, adaRMS dense); perturb every
    # parameter so each one matters to the output.
    with torch.no_grad():
        for name, p in policy.named_parameters():
            noise = torch.randn(p.shape, dtype=torch.float32) * 0.05
            p.add_(noise.to(p.dtype))
    policy.eval()
    return policy


def save_checkpoint(policy, kind: str, dtype: str) -> Path:
    d = OUT / f"{kind}_{dtype}"
    d.mkdir(parents=True, exist_ok=True)
    save_model(policy, str(d / "model.safetensors"))
    policy.config._save_pretrained(d)
    (d / "arch.json").write_text(json.dumps(ARCH, indent=2) + "\n")
    return d


def make_inputs(gen: torch.Generator, cameras: int, masked: list[int], batch: int, lengths: list[int],
                max_len: int, pi05: bool):
    t = {}
    for i in range(cameras):
        img = torch.rand(batch, 3, 224, 224, generator=gen) * 2 - 1
        if i in masked:
            img = torch.full_like(img, -1.0)
        t[f"image{i}"] = img
        t[f"img_mask{i}"] = torch.tensor([0 if i in masked else 1] * batch, dtype=torch.uint8)
    tokens = torch.zeros(batch, max_len, dtype=torch.int64)
    masks = torch.zeros(batch, max_len, dtype=torch.uint8)
    for b, n in enumerate(lengths):
        tokens[b, 0] = 2  # BOS
        tokens[b, 1:n] = torch.randint(3, VOCAB, (n - 1,), generator=gen)
        masks[b, :n] = 1
    t["lang_tokens"] = tokens
    t["lang_masks"] = masks
    state = torch.zeros(batch, 32)
    state[:, :ROBOT_DIM] = torch.rand(batch, ROBOT_DIM, generator=gen) * 2 - 1
    t["state"] = state
    t["noise"] = torch.randn(batch, 50, 32, generator=gen)
    return t


def run_case(policy, kind: str, name: str, inputs: dict):
    cams = sorted(k for k in inputs if k.startswith("image"))
    images = [inputs[k] for k in cams]
    img_masks = [inputs[k.replace("image", "img_mask")].bool() for k in cams]
    lang_tokens = inputs["lang_tokens"]
    lang_masks = inputs["lang_masks"].bool()
    with torch.no_grad():
        if kind == "pi0":
            actions = policy.model.sample_actions(
                images, img_masks, lang_tokens, lang_masks, inputs["state"], noise=inputs["noise"].clone()
            )
        else:
            actions = policy.model.sample_actions(
                images, img_masks, lang_tokens, lang_masks, noise=inputs["noise"].clone()
            )
    d = OUT / "cases" / name
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(d / "inputs.safetensors"))
    save_file({"actions": actions.float().contiguous()}, str(d / "expected.safetensors"))
    (d / "case.json").write_text(json.dumps({"checkpoint": f"{kind}_{policy.config.dtype}"}) + "\n")
    print(f"{name}: actions {tuple(actions.shape)} |a| max {actions.abs().max():.4f}")


def preprocessing_case(gen: torch.Generator):
    """A non-square uint8 frame through lerobot's path: /255, resize-with-pad to 224, *2-1."""
    h, w = 100, 160
    frame = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen)
    img = frame.float()[None] / 255.0
    out = resize_with_pad_torch(img, 224, 224)[0] * 2.0 - 1.0  # [224, 224, 3]
    d = OUT / "preprocess"
    d.mkdir(parents=True, exist_ok=True)
    save_file({"frame_rgb8": frame.contiguous(), "expected_chw": out.permute(2, 0, 1).contiguous()},
              str(d / "resize_with_pad.safetensors"))
    print(f"preprocess: {h}x{w} -> 224x224")


PROMPTS = [
    "pick up the red cube and put it in the bowl",
    "open the drawer",
    "stack the blocks",
    "wipe the table with the sponge",
    "push the button twice",
]


def make_tokenizer():
    """A small PaliGemma-style SentencePiece tokenizer (BPE with byte fallback, spaces as the
    metaspace, <bos> prepended), trained offline with the `tokenizers` package."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    corpus = PROMPTS * 4 + ["the a an and of to in on with cube bowl drawer table robot arm gripper\n"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz\u2581\n,.;:0123456789"),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    return tok, fast


def stats_for(dim: int, gen: torch.Generator):
    mean = torch.rand(dim, generator=gen) - 0.5
    std = torch.rand(dim, generator=gen) * 0.5 + 0.1
    q01 = mean - 2 * std
    q99 = mean + 2 * std
    return {
        "mean": mean, "std": std, "min": q01 - 0.1, "max": q99 + 0.1, "q01": q01, "q99": q99,
        "q10": mean - std, "q50": mean, "q90": mean + std,
    }


def end_to_end_case(policy, kind: str, fast_tokenizer, tok, gen: torch.Generator):
    """Raw observation -> lerobot's preprocessor -> model (fixed noise) -> postprocessor."""
    import lerobot.policies.pi0.processor_pi0 as proc0
    import lerobot.policies.pi05.processor_pi05 as proc05

    proc = proc0 if kind == "pi0" else proc05
    real_step = proc.TokenizerProcessorStep
    proc.TokenizerProcessorStep = lambda **kw: real_step(
        tokenizer=fast_tokenizer, **{k: v for k, v in kw.items() if k != "tokenizer_name"}
    )
    make = proc.make_pi0_pre_post_processors if kind == "pi0" else proc.make_pi05_pre_post_processors
    stats = {"observation.state": stats_for(ROBOT_DIM, gen), "action": stats_for(ROBOT_DIM, gen)}
    pre, post = make(policy.config, dataset_stats=stats)
    proc.TokenizerProcessorStep = real_step

    ck = OUT / f"{kind}_{policy.config.dtype}"
    pre.save_pretrained(str(ck))
    post.save_pretrained(str(ck))
    tok.save(str(ck / "tokenizer.json"))

    frames = {
        f"observation.images.cam{i}": torch.randint(0, 256, (1, 3, 90 + 30 * i, 160), dtype=torch.uint8, generator=gen)
        for i in range(2)
    }
    state = (torch.rand(1, ROBOT_DIM, generator=gen) - 0.5) * 0.6
    task = PROMPTS[0] if kind == "pi0" else PROMPTS[1]
    batch = {k: v.float() / 255.0 for k, v in frames.items()}
    batch["observation.state"] = state
    batch["task"] = task
    noise = torch.randn(1, 50, 32, generator=gen)
    processed = pre(batch)
    with torch.no_grad():
        actions = policy.predict_action_chunk(processed, noise=noise.clone())
    actions = post(actions)
    d = OUT / "cases" / f"{kind}_end_to_end"
    d.mkdir(parents=True, exist_ok=True)
    tensors = {f"frame{i}": frames[f"observation.images.cam{i}"][0].permute(1, 2, 0).contiguous() for i in range(2)}
    tensors["state"] = state[0].contiguous()
    tensors["noise"] = noise.contiguous()
    tensors["lang_tokens"] = processed["observation.language.tokens"].contiguous()
    tensors["lang_masks"] = processed["observation.language.attention_mask"].to(torch.uint8).contiguous()
    tensors["normalized_state"] = processed["observation.state"].contiguous()
    save_file(tensors, str(d / "raw.safetensors"))
    save_file({"actions": actions.float().contiguous()}, str(d / "expected.safetensors"))
    (d / "case.json").write_text(json.dumps({"checkpoint": ck.name, "task": task}) + "\n")
    print(f"{kind}_end_to_end: actions {tuple(actions.shape)}, {int(tensors['lang_masks'].sum())} prompt tokens")


def tokenizer_case(tok, fast):
    d = OUT / "tokenizer"
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    prompts = PROMPTS + ["", "Task: open the drawer, State: 12 200 3;\nAction: ", "unseen wörds ünïcode 42"]
    cases = []
    for p in prompts:
        enc = fast(p + "\n", padding="max_length", max_length=48, truncation=True)
        cases.append({"text": p + "\n", "ids": enc["input_ids"], "mask": enc["attention_mask"]})
    (d / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"tokenizer: {tok.get_vocab_size()} tokens, {len(cases)} prompts")


SIM_START = [0.0, 0.3, 0.6, -0.4, 0.0, 0.0, 0.02]


def save_bundled(policy, start, state_std, action_std, d: Path, tok, fast):
    """A bundled model's checkpoint in `d`: weights, config, arch.json, lerobot's processors
    with stats around `start` (std `state_std` / `action_std`), the tokenizer."""
    import lerobot.policies.pi0.processor_pi0 as proc

    def st(mean, std):
        return {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + 3 * std,
                "q01": mean - 2 * std, "q99": mean + 2 * std}

    real_step = proc.TokenizerProcessorStep
    proc.TokenizerProcessorStep = lambda **kw: real_step(
        tokenizer=fast, **{k: v for k, v in kw.items() if k != "tokenizer_name"}
    )
    pre, post = proc.make_pi0_pre_post_processors(
        policy.config, dataset_stats={"observation.state": st(start, state_std), "action": st(start, action_std)}
    )
    proc.TokenizerProcessorStep = real_step
    d.mkdir(parents=True, exist_ok=True)
    save_model(policy, str(d / "model.safetensors"))
    policy.config._save_pretrained(d)
    (d / "arch.json").write_text(json.dumps(ARCH, indent=2) + "\n")
    pre.save_pretrained(str(d))
    post.save_pretrained(str(d))
    tok.save(str(d / "tokenizer.json"))
    (d / "RANDOM_WEIGHTS").write_text(
        "This checkpoint has random weights (tools/make_golden.py): it exercises the whole pipeline\n"
        "but does not perform any task. `pi0d check` looks for this file to say so.\n")


def bundled_model(tok, fast):
    """models/tiny-pi0: the embedded default's policy. Random weights by lerobot's code, one
    camera, 7 joints; its stats keep actions within a few centiradians of the sim arm's start
    pose, so the real model path drives the simulated arm end to end."""
    torch.manual_seed(7)
    inputs = {
        "observation.images.front": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)),
        "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(ROBOT_DIM,)),
    }
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ROBOT_DIM,))}
    policy = PI0Policy(PI0Config(dtype="float32", device="cpu", input_features=inputs, output_features=outputs))
    d = ROOT / "models" / "tiny-pi0"
    save_bundled(policy, torch.tensor(SIM_START), torch.tensor([0.5] * 6 + [0.01]),
                 torch.tensor([0.001] * 6 + [0.00002]), d, tok, fast)
    print(f"bundled model: {d}")


ALOHA_JOINTS = [f"{side}_{j}" for side in ("left", "right")
                for j in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")]
ALOHA_START = [0.0, -0.3, -0.1, 0.0, 0.2, 0.0, 0.04] * 2
ALOHA_CAMERAS = ["cam_high", "cam_left_wrist", "cam_right_wrist"]


def bundled_aloha_model(tok, fast):
    """config/aloha.toml's policy: a tiny pi0 with ALOHA's three cameras and 14 actions in
    lerobot's order (random weights), its stats around the simulated robot's start pose."""
    torch.manual_seed(11)
    inputs = {f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224))
              for c in ALOHA_CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(14,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(14,))}
    policy = PI0Policy(PI0Config(dtype="float32", device="cpu", input_features=inputs, output_features=outputs))
    d = ROOT / "models" / "tiny-pi0-aloha"
    save_bundled(policy, torch.tensor(ALOHA_START), torch.tensor(([0.5] * 6 + [0.01]) * 2),
                 torch.tensor(([0.001] * 6 + [0.00002]) * 2), d, tok, fast)
    (d / "README.md").write_text(
        "# tiny-pi0-aloha\n\n"
        "`config/aloha.toml`'s policy: a pi0 checkpoint in lerobot's format with **random weights**, "
        "built by lerobot 0.6.1's own classes at the bundled tiny model's widths by "
        "`tools/make_golden.py --aloha`. Three cameras (`observation.images.cam_high`, "
        "`cam_left_wrist`, `cam_right_wrist`), 14 joints in lerobot's ALOHA order "
        f"({', '.join(ALOHA_JOINTS)}). Its normalization stats keep the actions within a few "
        "centiradians of the simulated robot's start pose.\n")
    print(f"bundled ALOHA model: {d}")


def f16_case(policy, gen: torch.Generator):
    """An f16-stored checkpoint. lerobot has no f16 mode, so its reference runs the same model
    with every weight rounded to f16 (computed in f32, as pi0d computes)."""
    d = OUT / "pi0_float16"
    d.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().clone().half().contiguous() for k, v in policy.state_dict().items()}
    save_file(sd, str(d / "model.safetensors"))
    policy.config._save_pretrained(d)
    (d / "arch.json").write_text(json.dumps(ARCH, indent=2) + "\n")
    with torch.no_grad():
        for p in policy.parameters():
            p.data = p.data.half().float()
    policy.config.dtype = "float16"  # the case's checkpoint name
    run_case(policy, "pi0", "pi0_f16_2cam", make_inputs(gen, 2, [], 1, [25], 48, False))


RTC_CASES = [
    # name, checkpoint kind, cameras, batch, leftover (steps, width), delay, horizon, schedule, max guidance
    ("pi0_f32_rtc_linear", "pi0", 1, 1, (38, ROBOT_DIM), 4, 10, "LINEAR", 10.0),
    ("pi0_f32_rtc_exp_batch2", "pi0", 2, 2, (44, ROBOT_DIM), 6, 20, "EXP", 10.0),
    ("pi0_f32_rtc_zeros", "pi0", 1, 1, (40, ROBOT_DIM), 5, 12, "ZEROS", 10.0),
    # A leftover shorter than the horizon: the horizon is cut to it.
    ("pi0_f32_rtc_ones_short", "pi0", 1, 1, (12, ROBOT_DIM), 3, 15, "ONES", 10.0),
    # A cap below every step's weight: the guidance saturates throughout.
    ("pi0_f32_rtc_saturated", "pi0", 1, 1, (45, ROBOT_DIM), 4, 25, "LINEAR", 0.5),
    ("pi05_f32_rtc_linear", "pi05", 1, 1, (42, ROBOT_DIM), 8, 16, "LINEAR", 10.0),
    # The whole padded width given: nothing padded.
    ("pi05_f32_rtc_exp_full", "pi05", 2, 1, (50, 32), 2, 30, "EXP", 10.0),
]


def rtc_cases(policies: dict):
    """lerobot's own RTC (RTCProcessor through sample_actions) on fixed noise and leftovers."""
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    gen = torch.Generator().manual_seed(6060)
    for name, kind, cams, batch, (steps, width), delay, horizon, schedule, beta in RTC_CASES:
        policy = policies[kind]
        inputs = make_inputs(gen, cams, [], batch, [11 + 7 * b for b in range(batch)], 48 if kind == "pi0" else 200,
                             kind == "pi05")
        leftover = torch.randn(batch, steps, width, generator=gen) * 0.8
        cams_k = sorted(k for k in inputs if k.startswith("image"))
        args = ([inputs[k] for k in cams_k], [inputs[k.replace("image", "img_mask")].bool() for k in cams_k],
                inputs["lang_tokens"], inputs["lang_masks"].bool())
        if kind == "pi0":
            args = args + (inputs["state"],)

        def sample(rtc: bool):
            policy.config.rtc_config = RTCConfig(enabled=rtc, prefix_attention_schedule=RTCAttentionSchedule(schedule),
                                                 max_guidance_weight=beta, execution_horizon=horizon)
            policy.init_rtc_processor()
            with torch.no_grad():
                return policy.model.sample_actions(*args, noise=inputs["noise"].clone(), inference_delay=delay,
                                                   prev_chunk_left_over=leftover.clone(), execution_horizon=horizon)

        actions, plain = sample(True), sample(False)
        policy.config.rtc_config = None
        policy.init_rtc_processor()
        inputs["rtc_prev_chunk"] = leftover
        inputs["rtc_inference_delay"] = torch.tensor(delay, dtype=torch.int64)
        inputs["rtc_execution_horizon"] = torch.tensor(horizon, dtype=torch.int64)
        d = OUT / "cases" / name
        d.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(d / "inputs.safetensors"))
        save_file({"actions": actions.float().contiguous(), "plain_actions": plain.float().contiguous()},
                  str(d / "expected.safetensors"))
        (d / "case.json").write_text(json.dumps({"checkpoint": f"{kind}_float32", "rtc_schedule": schedule.lower(),
                                                 "rtc_max_guidance": beta}) + "\n")
        k = min(delay, horizon, steps)
        near = (actions[:, :k, :width] - leftover[:, :k]).abs().max()
        near_plain = (plain[:, :k, :width] - leftover[:, :k]).abs().max()
        print(f"{name}: first {k} steps within {near:.3f} of the leftover (plain {near_plain:.3f}); "
              f"guided - plain max {(actions - plain).abs().max():.3f}")


def main():
    if "--aloha" in sys.argv:
        tok, fast = make_tokenizer()
        bundled_aloha_model(tok, fast)
        return
    if "--rtc" in sys.argv:
        # Only the RTC cases, on the committed f32 checkpoints (rebuilt from their seeds and checked).
        policies = {"pi0": build("pi0", "float32", seed=1), "pi05": build("pi05", "float32", seed=3)}
        for kind, p in policies.items():
            from safetensors.torch import load_file
            saved = load_file(str(OUT / f"{kind}_float32" / "model.safetensors"))
            for n, t in p.state_dict().items():
                if n in saved:
                    assert torch.equal(saved[n], t), f"{kind}: {n} differs from the committed checkpoint"
        rtc_cases(policies)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    pi0_f32 = build("pi0", "float32", seed=1)
    save_checkpoint(pi0_f32, "pi0", "float32")
    run_case(pi0_f32, "pi0", "pi0_f32_1cam_short", make_inputs(gen, 1, [], 1, [9], 48, False))
    run_case(pi0_f32, "pi0", "pi0_f32_2cam_batch2", make_inputs(gen, 2, [], 2, [48, 17], 48, False))
    run_case(pi0_f32, "pi0", "pi0_f32_3cam_masked", make_inputs(gen, 3, [1], 1, [30], 48, False))

    pi0_bf16 = build("pi0", "bfloat16", seed=2)
    save_checkpoint(pi0_bf16, "pi0", "bfloat16")
    run_case(pi0_bf16, "pi0", "pi0_bf16_2cam", make_inputs(gen, 2, [], 1, [20], 48, False))

    pi05_f32 = build("pi05", "float32", seed=3)
    save_checkpoint(pi05_f32, "pi05", "float32")
    run_case(pi05_f32, "pi05", "pi05_f32_2cam_batch2", make_inputs(gen, 2, [], 2, [60, 200], 200, True))
    run_case(pi05_f32, "pi05", "pi05_f32_1cam", make_inputs(gen, 1, [], 1, [37], 200, True))

    tok, fast = make_tokenizer()
    tokenizer_case(tok, fast)
    end_to_end_case(pi0_f32, "pi0", fast, tok, gen)
    end_to_end_case(pi05_f32, "pi05", fast, tok, gen)
    bundled_model(tok, fast)
    bundled_aloha_model(tok, fast)

    preprocessing_case(gen)
    f16_case(pi0_f32, gen)
    rtc_cases({"pi0": pi0_f32, "pi05": pi05_f32})
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"fixtures: {total / 1e6:.1f} MB under {OUT}")


if __name__ == "__main__":
    sys.exit(main())
