#!/usr/bin/env python3
"""The camera frames of a pi0d recording ([record]) as an animated GIF: what the policy saw,
frame by frame, at the camera's rate. Read with the `mcap` and `mcap-ros2-support` packages
(in the project's .venv, made by tools/peers_venv.sh).

    .venv/bin/python tools/mcap_gif.py RUN.mcap OUT.gif [--camera NAME] [--scale N]
"""

import argparse
import io
import sys

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from PIL import Image


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recording")
    ap.add_argument("out")
    ap.add_argument("--camera", default=None, help="the camera's name (default: the first recorded)")
    ap.add_argument("--scale", type=int, default=3, help="pixels per camera pixel")
    args = ap.parse_args()
    factory = DecoderFactory()
    decoders = {}
    frames = {}
    with open(args.recording, "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=True):
            if schema is None or schema.name != "sensor_msgs/msg/CompressedImage":
                continue
            name = channel.topic.removeprefix("/pi0d/camera/").removesuffix("/compressed")
            if channel.id not in decoders:
                decoders[channel.id] = factory.decoder_for(channel.message_encoding, schema)
            msg = decoders[channel.id](message.data)
            frames.setdefault(name, []).append((message.log_time, Image.open(io.BytesIO(bytes(msg.data))).convert("RGB")))
    if not frames:
        sys.exit(f"{args.recording}: no camera frames recorded")
    name = args.camera or sorted(frames)[0]
    if name not in frames:
        sys.exit(f"{args.recording}: no camera named {name!r} (recorded: {', '.join(sorted(frames))})")
    shots = frames[name]
    images = [im.resize((im.width * args.scale, im.height * args.scale), Image.NEAREST) for _, im in shots]
    # Each frame shown for as long as it was the newest (log times in ns).
    durations = [max(int((b - a) / 1e6), 20) for (a, _), (b, _) in zip(shots, shots[1:])] + [1000]
    images[0].save(args.out, save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=True)
    print(f"{args.out}: {len(images)} frames of camera {name!r}, {(shots[-1][0] - shots[0][0]) / 1e9:.1f} s")


if __name__ == "__main__":
    main()
