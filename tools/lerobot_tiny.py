"""pi0 at the bundled tiny model's widths, trained from scratch with lerobot's own training
loop on the CPU (tools/hil_task.py's and tools/sim_task.py's `train`), and the bundled
tokenizer in its processors (no hub)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "models/tiny-pi0/tokenizer.json"


def tiny_pi0():
    """make_golden's tiny widths patched into lerobot's pi0 (on import) and the bundled
    tokenizer in its processors (no hub): the tokenizer, for loading saved processors."""
    sys.path.insert(0, str(ROOT / "tools"))
    import make_golden  # noqa: F401
    import lerobot.policies.pi0.processor_pi0 as proc
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(TOKENIZER)),
                                   bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    real_step = proc.TokenizerProcessorStep
    proc.TokenizerProcessorStep = lambda **kw: real_step(
        tokenizer=fast, **{k: v for k, v in kw.items() if k != "tokenizer_name"})
    return fast


def train(args, name: str):
    tiny_pi0()
    import make_golden
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    import lerobot.scripts.lerobot_train as lerobot_train_module
    from lerobot.scripts.lerobot_train import train as lerobot_train

    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    policy = PI0Config(device="cpu", dtype="float32", push_to_hub=False,
                       image_resolution=(args.resolution, args.resolution),
                       optimizer_lr=args.lr, scheduler_warmup_steps=min(200, args.steps // 10),
                       scheduler_decay_steps=args.steps, scheduler_decay_lr=args.lr / 10)
    cfg = TrainPipelineConfig(
        dataset=DatasetConfig(repo_id=f"pi0d/{name}", root=str(args.data)),
        policy=policy, output_dir=work, job_name=name, seed=args.seed,
        steps=args.steps, batch_size=args.batch_size, num_workers=args.workers,
        log_freq=args.log_every, save_freq=min(args.save_every, args.steps), save_checkpoint=True, env_eval_freq=0,
        persistent_workers=False, prefetch_factor=2 if args.workers else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # lerobot's training sets logging up afresh (init_logging): its own log file goes next to
    # the checkpoint (the training log committed with it).
    real_init = lerobot_train_module.init_logging
    (out / "train.log").unlink(missing_ok=True)
    lerobot_train_module.init_logging = lambda **kw: real_init(log_file=out / "train.log", file_level="INFO", **kw)
    if getattr(args, "init", None):
        # A second round: the policy lerobot builds starts from a checkpoint's weights (a fresh
        # optimizer and schedule; the processors from this dataset's stats, as before).
        from safetensors.torch import load_file

        weights = load_file(str(Path(args.init) / "model.safetensors"))
        real_make = lerobot_train_module.make_policy

        def make_policy(*a, **kw):
            p = real_make(*a, **kw)
            p.load_state_dict(weights, strict=True)
            return p

        lerobot_train_module.make_policy = make_policy
    lerobot_train(cfg)

    # The last checkpoint as pi0d reads it.
    trained = work / "checkpoints" / "last" / "pretrained_model"
    for f in trained.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    shutil.copy(TOKENIZER, out / "tokenizer.json")
    (out / "arch.json").write_text(json.dumps(make_golden.ARCH, indent=2) + "\n")
    print(f"checkpoint: {out}")


