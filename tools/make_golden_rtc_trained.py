#!/usr/bin/env python3
"""Golden outputs for lerobot's *training-time* real-time chunking (pi0.5 trained with
`rtc_training_max_delay`, sampled with `RTCConfig(mode="trained")`), which lerobot added after
0.6.1 (PR #4056). Run by hand; CI uses the committed cases.

The reference is lerobot at a pinned commit, kept outside this repository:

    git clone https://github.com/huggingface/lerobot /tmp/lerobot-src      # or any mirror
    git -C /tmp/lerobot-src archive 15b19df7dbdbe00781a3b4c0dd2fbad0571e76da | tar -x -C /tmp/lerobot-15b19df
    tools/golden/setup.sh                                                    # once
    ~/venvs/golden/bin/python tools/make_golden_rtc_trained.py /tmp/lerobot-15b19df/src

The pinned source goes first on sys.path (the golden venv's lerobot 0.6.1 has no trained mode;
the pinned code runs on the same torch 2.11 / transformers 5.5.4). The tiny random-weight
PI05Policy is built as tools/make_golden.py builds it (seed 3, the same shrunk widths and
perturbation) and checked equal to the committed tests/fixtures/pi05_float32 weights.

Writes tests/fixtures/cases/pi05_f32_rtc_trained_*/{inputs,expected}.safetensors and case.json
(one case also a per-step trace: what each denoise step took and gave), and
tests/fixtures/pi05_float32_rtc8/config.json (the config as the pinned code saves it; the
other files there link to pi05_float32's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if len(sys.argv) != 2:
    raise SystemExit(__doc__)
PINNED_SRC = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(PINNED_SRC))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import lerobot  # noqa: E402

assert Path(lerobot.__file__).resolve().is_relative_to(PINNED_SRC), lerobot.__file__

from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d  # noqa: E402
from lerobot.policies.pi05.configuration_pi05 import PI05Config  # noqa: E402
from lerobot.policies.pi05.modeling_pi05 import PI05Policy  # noqa: E402
from lerobot.policies.rtc.configuration_rtc import RTCConfig  # noqa: E402

sys.path.insert(1, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402  (shrinks the pinned lerobot's models as for the other goldens)

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
OUT = FIXTURES / "cases"
COMMITTED_PI05 = FIXTURES / "pi05_float32" / "model.safetensors"
PINNED_COMMIT = "15b19df7dbdbe00781a3b4c0dd2fbad0571e76da"
TRAINING_MAX_DELAY = 8

ROBOT_DIM = mg.ROBOT_DIM


def build_pi05(seed: int = 3) -> PI05Policy:
    """make_golden.py's build('pi05', 'float32', seed=3), plus rtc_training_max_delay."""
    torch.manual_seed(seed)
    inputs, outputs = mg.features(3)
    cfg = PI05Config(
        dtype="float32",
        device="cpu",
        input_features=inputs,
        output_features=outputs,
        rtc_training_max_delay=TRAINING_MAX_DELAY,  # config-only; builds no parameters
    )
    policy = PI05Policy(cfg)
    with torch.no_grad():
        for _name, p in policy.named_parameters():
            noise = torch.randn(p.shape, dtype=torch.float32) * 0.05
            p.add_(noise.to(p.dtype))
    policy.eval()
    return policy


# name, cameras, batch, leftover (steps, width), inference_delay d, execution_horizon
CASES = [
    # The first chunk of a rollout: the engine passes inference_delay=0 (and no leftover at all).
    # Trained mode is then exactly the plain sampler. A leftover is still stored, to show d=0
    # ignores it.
    ("pi05_f32_rtc_trained_d0_first", 1, 1, (10, ROBOT_DIM), 0, 10),
    ("pi05_f32_rtc_trained_d3", 1, 1, (10, ROBOT_DIM), 3, 10),
    # d == rtc_training_max_delay, batch 2, two cameras, a leftover longer than d.
    ("pi05_f32_rtc_trained_d8_batch2", 2, 2, (12, ROBOT_DIM), 8, 12),
    # Leftover given at the model's full padded width (32): the padded dims are clamped too.
    ("pi05_f32_rtc_trained_d5_full", 1, 1, (10, 32), 5, 10),
]


def model_args(inputs: dict):
    cams = sorted(k for k in inputs if k.startswith("image"))
    images = [inputs[k] for k in cams]
    img_masks = [inputs[k.replace("image", "img_mask")].bool() for k in cams]
    return images, img_masks, inputs["lang_tokens"], inputs["lang_masks"].bool()


def set_rtc(policy: PI05Policy, rtc: RTCConfig | None):
    policy.config.rtc_config = rtc
    policy.init_rtc_processor()  # also hands the processor to policy.model


def sample_traced(policy: PI05Policy, args, noise, **kw):
    """policy.model.sample_actions, recording every denoise_step call (x_t in, time in, v_t out)."""
    model = policy.model
    real = model.denoise_step
    trace = {"x_t": [], "time": [], "v_t": []}

    def traced(prefix_pad_masks, past_key_values, x_t, timestep):
        v = real(prefix_pad_masks=prefix_pad_masks, past_key_values=past_key_values, x_t=x_t, timestep=timestep)
        trace["x_t"].append(x_t.clone())
        tt = timestep if timestep.ndim == 2 else timestep[:, None].expand(x_t.shape[0], x_t.shape[1])
        trace["time"].append(tt.clone().float())
        trace["v_t"].append(v.clone())
        return v

    model.denoise_step = traced
    try:
        with torch.no_grad():
            out = model.sample_actions(*args, noise=noise.clone(), **kw)
    finally:
        del model.denoise_step
    return out, {k: torch.stack(v) for k, v in trace.items()}


def independent_reference(policy: PI05Policy, args, noise, leftover, d: int):
    """My own transcription of the trained-mode math (REPORT.md section 2), using only the model's
    embed_prefix / paligemma_with_expert / denoise_step pieces. Must match sample_actions."""
    model = policy.model
    images, img_masks, tokens, masks = args
    with torch.no_grad():
        prefix_embs, prefix_pad_masks, prefix_att_masks = model.embed_prefix(images, img_masks, tokens, masks)
        att = prepare_attention_masks_4d(make_att_2d_masks(prefix_pad_masks, prefix_att_masks))
        pos = torch.cumsum(prefix_pad_masks, dim=1) - 1
        _, kv = model.paligemma_with_expert.forward(
            attention_mask=att, position_ids=pos, past_key_values=None,
            inputs_embeds=[prefix_embs, None], use_cache=True,
        )
        B, T, A = noise.shape
        n = model.config.num_inference_steps
        dt = -1.0 / n
        x = noise.clone()
        prefix = torch.zeros_like(x)
        prefix[:, :d, : leftover.shape[-1]] = leftover[:, :d].to(x.dtype)
        for step in range(n):
            t = 1.0 + step * dt
            x[:, :d] = prefix[:, :d]  # clamp before the step (all 32 dims, zeros past the leftover's width)
            time = torch.full((B, T), t, dtype=torch.float32)
            time[:, :d] = 0.0  # clean tokens carry flow time 0
            v = model.denoise_step(prefix_pad_masks=prefix_pad_masks, past_key_values=kv, x_t=x, timestep=time)
            x = x + dt * v
            x[:, :d] = prefix[:, :d]  # clamp after the step
        return x


def uniform_time_ablation(policy: PI05Policy, args, noise, leftover, d: int, horizon: int):
    """What a port that clamps x_t but forgets the per-token time would produce: the clamp kept,
    every token given the step's scalar time. Only used to size test tolerances."""
    model = policy.model
    real = model.denoise_step

    def uniform(prefix_pad_masks, past_key_values, x_t, timestep):
        t = timestep[:, -1] if timestep.ndim == 2 else timestep  # position 49 is never clamped (d < 50)
        return real(prefix_pad_masks=prefix_pad_masks, past_key_values=past_key_values, x_t=x_t, timestep=t)

    set_rtc(policy, RTCConfig(enabled=True, mode="trained", execution_horizon=horizon))
    model.denoise_step = uniform  # sample_traced wraps it and removes the override afterwards
    out, trace = sample_traced(policy, args, noise, inference_delay=d, prev_chunk_left_over=leftover.clone())
    set_rtc(policy, None)
    return out, trace


def main():
    policy = build_pi05(seed=3)

    # Same parameter names and values as the committed lerobot-0.6.1 fixture?
    committed = load_file(str(COMMITTED_PI05)) if COMMITTED_PI05.exists() else None
    sd = policy.state_dict()
    if committed is not None:
        missing = sorted(set(committed) - set(sd))
        extra = sorted(set(sd) - set(committed))
        differ = [k for k in sd if k in committed and not torch.equal(committed[k], sd[k])]
        print(f"weights vs committed pi05_float32: {len(sd)} tensors here, {len(committed)} committed, "
              f"missing {missing[:5]}, extra {extra[:5]}, differing {differ[:5]}")
        assert not missing and not differ, "pinned build differs from the committed checkpoint"
        weights_match = True
    else:
        weights_match = None

    OUT.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "pi05_float32_rtc8").mkdir(exist_ok=True)
    policy.config._save_pretrained(FIXTURES / "pi05_float32_rtc8")  # config.json as the pinned code writes it

    # Misuse checks, as the pinned code enforces them.
    try:
        bad = PI05Config(chunk_size=50, n_action_steps=50, rtc_training_max_delay=50)
        raise AssertionError(f"accepted {bad.rtc_training_max_delay}")
    except ValueError as e:
        print(f"config check: {e}")

    gen = torch.Generator().manual_seed(4056)
    summary = []
    for name, cams, batch, (steps, width), d, horizon in CASES:
        inputs = mg.make_inputs(gen, cams, [], batch, [11 + 7 * b for b in range(batch)], 200, True)
        leftover = torch.randn(batch, steps, width, generator=gen) * 0.8
        args = model_args(inputs)
        noise = inputs["noise"]

        set_rtc(policy, RTCConfig(enabled=True, mode="trained", execution_horizon=horizon))
        actions, trace = sample_traced(policy, args, noise, inference_delay=d,
                                       prev_chunk_left_over=leftover.clone(), execution_horizon=horizon)
        if d == 0:
            # what the rollout engine really passes for the first chunk: no leftover at all
            first, _ = sample_traced(policy, args, noise, inference_delay=0, prev_chunk_left_over=None)
            assert torch.equal(first, actions)
        else:
            # the sampler refuses d beyond the checkpoint's trained range
            try:
                sample_traced(policy, args, noise, inference_delay=TRAINING_MAX_DELAY + 1,
                              prev_chunk_left_over=torch.randn(batch, TRAINING_MAX_DELAY + 2, width))
                raise AssertionError("d > rtc_training_max_delay accepted")
            except ValueError:
                pass
        set_rtc(policy, None)
        plain, _ = sample_traced(policy, args, noise)

        ref = independent_reference(policy, args, noise, leftover, d)
        ref_diff = (ref - actions).abs().max().item()
        if d > 0:
            abl, abl_trace = uniform_time_ablation(policy, args, noise, leftover, d, horizon)
            abl_tail = (abl[:, d:] - actions[:, d:]).abs().max().item()
            abl_v0_prefix = (abl_trace["v_t"][0, :, :d] - trace["v_t"][0, :, :d]).abs().max().item()
        else:
            abl_tail = abl_v0_prefix = None

        # Checks
        if d > 0:
            head_equal = torch.equal(actions[:, :d, :width], leftover[:, :d])
            pad_zero = bool((actions[:, :d, width:] == 0).all()) if width < 32 else True
            assert head_equal and pad_zero, name
            assert trace["time"][:, :, :d].eq(0).all()
            assert torch.equal(trace["x_t"][:, :, :d, :width], leftover[:, :d].expand(trace["x_t"].shape[0], -1, -1, -1))
        else:
            head_equal = pad_zero = None
            assert torch.equal(actions, plain), "d=0 must be the plain sampler"
        diff = (actions - plain).abs().max().item()
        tail_diff = (actions[:, d:] - plain[:, d:]).abs().max().item()

        case_dir = OUT / name
        case_dir.mkdir(parents=True, exist_ok=True)
        inputs["rtc_prev_chunk"] = leftover
        inputs["rtc_inference_delay"] = torch.tensor(d, dtype=torch.int64)
        inputs["rtc_execution_horizon"] = torch.tensor(horizon, dtype=torch.int64)
        inputs["rtc_training_max_delay"] = torch.tensor(TRAINING_MAX_DELAY, dtype=torch.int64)
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(case_dir / "inputs.safetensors"))
        save_file({"actions": actions.float().contiguous(), "plain_actions": plain.float().contiguous()},
                  str(case_dir / "expected.safetensors"))
        # Per Euler step s (10 steps): the x_t the model saw (after the pre-step clamp), the per-token
        # flow time it saw, and the velocity it returned. [steps, B, 50, 32] / [steps, B, 50].
        if name.endswith("_d3"):  # one case is enough to test a single step (the others are large)
            save_file({"x_t": trace["x_t"].contiguous(), "time": trace["time"].contiguous(),
                       "v_t": trace["v_t"].contiguous()}, str(case_dir / "trace.safetensors"))
        meta = {
            "checkpoint": "pi05_float32_rtc8",
            "rtc_mode": "trained",
            "rtc_training_max_delay": TRAINING_MAX_DELAY,
            "rtc_inference_delay": d,
            "rtc_execution_horizon": horizon,
            "lerobot_commit": PINNED_COMMIT,
        }
        (case_dir / "case.json").write_text(json.dumps(meta) + "\n")
        line = (f"{name}: d={d} leftover {tuple(leftover.shape)} | max|actions-plain| {diff:.4f} "
                f"(positions >= d: {tail_diff:.4f}) | first d == leftover: {head_equal}, padded dims 0: {pad_zero} "
                f"| independent reference max diff {ref_diff:.3g} | forgetting per-token time: actions[d:] off by "
                f"{abl_tail}, step-0 v_t[:d] off by {abl_v0_prefix}")
        print(line)
        summary.append({"case": name, "d": d, "max_abs_actions_minus_plain": diff,
                        "max_abs_tail_minus_plain": tail_diff, "first_d_equal_leftover": head_equal,
                        "padded_dims_zero": pad_zero, "independent_reference_max_diff": ref_diff,
                        "uniform_time_ablation_tail_max_diff": abl_tail,
                        "uniform_time_ablation_step0_prefix_v_max_diff": abl_v0_prefix})

    print(json.dumps({"commit": PINNED_COMMIT, "weights_match_committed": weights_match, "cases": summary},
                     indent=1))


if __name__ == "__main__":
    sys.exit(main())
