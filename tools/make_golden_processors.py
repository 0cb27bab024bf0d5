#!/usr/bin/env python3
"""Writes the processor-pipeline golden cases under tests/fixtures/processors/ with lerobot's own
code: relative actions (pi0 and pi0.5, with and without excluded joints and action names), a
rename map, tokenizer settings (padded to the longest, padded on the left), and real-time
chunking with relative actions (the leftover re-anchored by lerobot's
`reanchor_relative_rtc_prefix`).

Run by hand (CI uses the committed cases):

    tools/golden/setup.sh                                  # once
    ~/venvs/golden/bin/python tools/make_golden_processors.py

Each case holds what lerobot saves beside a checkpoint (config.json, the two pipeline files and
their stats) plus the raw observation and the actions lerobot's pre-processor -> model ->
post-processor gave for it; the weights are the committed tests/fixtures/pi0_float32 and
pi05_float32 (rebuilt here from their seeds by make_golden.py's code and checked equal), which
the Rust tests put beside the case's files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402  (patches lerobot's globals for the tiny models)

from lerobot.configs.types import RTCAttentionSchedule  # noqa: E402
from lerobot.policies.rtc.configuration_rtc import RTCConfig  # noqa: E402
from lerobot.policies.rtc.relative import reanchor_relative_rtc_prefix  # noqa: E402
from lerobot.processor import NormalizerProcessorStep, RelativeActionsProcessorStep  # noqa: E402
from lerobot.processor import TokenizerProcessorStep  # noqa: E402

OUT = mg.OUT / "processors"
NAMES = [f"joint{i}.pos" for i in range(6)] + ["gripper.pos"]


def fast_tokenizer():
    """The committed tokenizer.json as lerobot's tokenizer step takes it."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(mg.OUT / "pi0_float32" / "tokenizer.json"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def policies():
    """The committed f32 checkpoints' models, rebuilt from their seeds and checked equal."""
    out = {"pi0": mg.build("pi0", "float32", seed=1), "pi05": mg.build("pi05", "float32", seed=3)}
    for kind, p in out.items():
        saved = load_file(str(mg.OUT / f"{kind}_float32" / "model.safetensors"))
        for n, t in p.state_dict().items():
            if n in saved:
                assert torch.equal(saved[n], t), f"{kind}: {n} differs from the committed checkpoint"
    return out


def processors(policy, kind: str, fast, stats, edit=None):
    import lerobot.policies.pi0.processor_pi0 as proc0
    import lerobot.policies.pi05.processor_pi05 as proc05

    proc = proc0 if kind == "pi0" else proc05
    real_step = proc.TokenizerProcessorStep
    proc.TokenizerProcessorStep = lambda **kw: real_step(
        tokenizer=fast, **{k: v for k, v in kw.items() if k != "tokenizer_name"}
    )
    make = proc.make_pi0_pre_post_processors if kind == "pi0" else proc.make_pi05_pre_post_processors
    try:
        pre, post = make(policy.config, dataset_stats=stats)
    finally:
        proc.TokenizerProcessorStep = real_step
    if edit:
        edit(pre, post)
    return pre, post


def step(pipeline, cls):
    return next(s for s in pipeline.steps if isinstance(s, cls))


CASES = [
    # name, kind, config changes, stats seed, rename map (robot key -> model key), tokenizer edit, rtc
    ("pi0_relative_gripper_excluded", "pi0",
     dict(use_relative_actions=True, relative_exclude_joints=["gripper"], action_feature_names=NAMES), None, None, None),
    # No names: lerobot makes every dimension relative, the gripper included.
    ("pi0_relative_no_names", "pi0",
     dict(use_relative_actions=True, relative_exclude_joints=["gripper"], action_feature_names=None), None, None, None),
    # Two tokens, case-insensitive substrings: joint0 and the gripper stay absolute.
    ("pi05_relative_two_excluded", "pi05",
     dict(use_relative_actions=True, relative_exclude_joints=["GRIPPER", "joint0"], action_feature_names=NAMES),
     None, None, None),
    ("pi05_relative_all", "pi05",
     dict(use_relative_actions=True, relative_exclude_joints=[], action_feature_names=NAMES), None, None, None),
    ("pi0_rename_map", "pi0", {},
     {"observation.images.top": "observation.images.cam1", "observation.images.wrist": "observation.images.cam0"},
     None, None),
    ("pi0_tokens_longest", "pi0", {}, None, dict(padding="longest"), None),
    ("pi05_tokens_left", "pi05", {}, None, dict(padding_side="left"), None),
    ("pi0_relative_rtc", "pi0",
     dict(use_relative_actions=True, relative_exclude_joints=["gripper"], action_feature_names=NAMES), None, None,
     dict(steps=40, delay=5, horizon=12, schedule="LINEAR", beta=10.0)),
    ("pi05_relative_rtc", "pi05",
     dict(use_relative_actions=True, relative_exclude_joints=["gripper"], action_feature_names=NAMES), None, None,
     dict(steps=44, delay=3, horizon=15, schedule="EXP", beta=5.0)),
]


def run(policies_by_kind, fast):
    gen = torch.Generator().manual_seed(4343)
    for name, kind, changes, rename, tok_edit, rtc in CASES:
        policy = policies_by_kind[kind]
        saved_cfg = {k: getattr(policy.config, k) for k in changes}
        for k, v in changes.items():
            setattr(policy.config, k, v)
        stats = {"observation.state": mg.stats_for(mg.ROBOT_DIM, gen), "action": mg.stats_for(mg.ROBOT_DIM, gen)}
        if changes.get("use_relative_actions"):
            # Relative actions are small offsets: stats of that size.
            stats["action"]["mean"] = stats["action"]["mean"] * 0.1
            stats["action"]["std"] = stats["action"]["std"] * 0.2
            stats["action"]["q01"] = stats["action"]["mean"] - 2 * stats["action"]["std"]
            stats["action"]["q99"] = stats["action"]["mean"] + 2 * stats["action"]["std"]

        def edit(pre, post):
            if rename:
                from lerobot.processor.rename_processor import RenameObservationsProcessorStep
                step(pre, RenameObservationsProcessorStep).rename_map = dict(rename)
            if tok_edit:
                t = step(pre, TokenizerProcessorStep)
                for k, v in tok_edit.items():
                    setattr(t, k, v)

        pre, post = processors(policy, kind, fast, stats, edit)
        d = OUT / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        policy.config._save_pretrained(d)
        pre.save_pretrained(str(d))
        post.save_pretrained(str(d))

        robot_cams = ["top", "wrist"] if rename else ["cam0", "cam1"]
        frames = {
            f"observation.images.{c}": torch.randint(0, 256, (1, 3, 96 + 24 * i, 128), dtype=torch.uint8,
                                                     generator=gen)
            for i, c in enumerate(robot_cams)
        }
        state = (torch.rand(1, mg.ROBOT_DIM, generator=gen) - 0.5) * 1.2
        task = mg.PROMPTS[2] if kind == "pi0" else mg.PROMPTS[3]
        batch = {k: v.float() / 255.0 for k, v in frames.items()}
        batch["observation.state"] = state.clone()
        batch["task"] = task
        noise = torch.randn(1, 50, 32, generator=gen)
        processed = pre(batch)
        kwargs = {}
        case = {"checkpoint": f"{kind}_float32", "task": task, "cameras": robot_cams}
        tensors = {}
        if rtc:
            policy.config.rtc_config = RTCConfig(
                enabled=True, prefix_attention_schedule=RTCAttentionSchedule(rtc["schedule"]),
                max_guidance_weight=rtc["beta"], execution_horizon=rtc["horizon"])
            policy.init_rtc_processor()
            # The running chunk's leftover as executed: absolute joint positions near the state.
            leftover = state + torch.cumsum(torch.randn(rtc["steps"], mg.ROBOT_DIM, generator=gen) * 0.02, 0)
            relative_step = step(pre, RelativeActionsProcessorStep)
            normalizer = step(pre, NormalizerProcessorStep)
            model_leftover = reanchor_relative_rtc_prefix(
                prev_actions_absolute=leftover, current_state=relative_step.get_cached_state(),
                relative_step=relative_step, normalizer_step=normalizer, policy_device="cpu")
            kwargs = dict(inference_delay=rtc["delay"], prev_chunk_left_over=model_leftover,
                          execution_horizon=rtc["horizon"])
            tensors["rtc_leftover"] = leftover.contiguous()
            tensors["rtc_model_leftover"] = model_leftover.reshape(-1, mg.ROBOT_DIM).contiguous()
            case.update(rtc_inference_delay=rtc["delay"], rtc_execution_horizon=rtc["horizon"],
                        rtc_schedule=rtc["schedule"].lower(), rtc_max_guidance=rtc["beta"])
        with torch.no_grad():
            raw_actions = policy.predict_action_chunk(processed, noise=noise.clone(), **kwargs)
        actions = post(raw_actions.clone())
        if rtc:
            policy.config.rtc_config = None
            policy.init_rtc_processor()
        for k, v in saved_cfg.items():
            setattr(policy.config, k, v)

        for i, c in enumerate(robot_cams):
            tensors[f"frame{i}"] = frames[f"observation.images.{c}"][0].permute(1, 2, 0).contiguous()
        tensors["state"] = state[0].contiguous()
        tensors["noise"] = noise.contiguous()
        tensors["lang_tokens"] = processed["observation.language.tokens"].contiguous()
        tensors["lang_masks"] = processed["observation.language.attention_mask"].to(torch.uint8).contiguous()
        tensors["normalized_state"] = processed["observation.state"].contiguous()
        tensors["model_actions"] = raw_actions.float().contiguous()
        save_file(tensors, str(d / "raw.safetensors"))
        save_file({"actions": actions.float().contiguous()}, str(d / "expected.safetensors"))
        (d / "case.json").write_text(json.dumps(case, indent=1) + "\n")
        offset = (actions - raw_actions).abs().max()
        print(f"{name}: {int(tensors['lang_masks'].sum())} of {tensors['lang_masks'].shape[1]} tokens, "
              f"postprocessed - model output up to {offset:.3f}")


def main():
    fast = fast_tokenizer()
    run(policies(), fast)
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"processor cases: {total / 1e6:.2f} MB under {OUT}")


if __name__ == "__main__":
    sys.exit(main())
