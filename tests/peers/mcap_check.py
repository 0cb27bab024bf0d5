#!/usr/bin/env python3
"""Reads a pi0d MCAP recording back with the `mcap` and `mcap-ros2-support` packages (the
readers Foxglove's own tools are built on) and prints what it found as JSON.

    .venv/bin/python tests/peers/mcap_check.py RUN.mcap [--values]

ROS 2 channels are decoded with mcap-ros2-support's CDR decoder from the schema in the file,
and each ros2msg schema is compared with the definition rosbags' ROS 2 Jazzy type store
generates. JSON channels are parsed; JPEG frames are opened with Pillow. With --values, each
chunk's positions and model output and every measured joint state are printed as well.
"""

import io
import json
import sys

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from PIL import Image
from rosbags.typesys import Stores, get_typestore


def main(path, values=False):
    store = get_typestore(Stores.ROS2_JAZZY)
    factory = DecoderFactory()
    decoders = {}
    out = {
        "topics": {},
        "schemas": {},
        "metadata": {},
        "joint_names": None,
        "measured_stamps_increasing": True,
        "command_max_abs_velocity": {},
        "command_log_times_increasing": True,
        "chunks": [],
        "events": [],
        "frames": [],
        "diagnostics": [],
        "measured": [],
    }
    last_measured = -1
    last_command = -1
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        out["statistics_message_count"] = summary.statistics.message_count if summary and summary.statistics else None
        for m in reader.iter_metadata():
            out["metadata"][m.name] = dict(m.metadata)
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            t = out["topics"].setdefault(
                channel.topic,
                {
                    "count": 0,
                    "schema": schema.name if schema else None,
                    "schema_encoding": schema.encoding if schema else None,
                    "message_encoding": channel.message_encoding,
                },
            )
            t["count"] += 1
            if schema is not None and schema.name not in out["schemas"]:
                entry = {"encoding": schema.encoding}
                if schema.encoding == "ros2msg":
                    expected, _ = store.generate_msgdef(schema.name, ros_version=2)
                    entry["matches_rosbags"] = schema.data.decode() == expected
                out["schemas"][schema.name] = entry
            if channel.message_encoding == "cdr":
                if schema.id not in decoders:
                    decoders[schema.id] = factory.decoder_for(channel.message_encoding, schema)
                msg = decoders[schema.id](message.data)
            elif channel.message_encoding == "json":
                msg = json.loads(message.data)
            else:
                raise SystemExit(f"{channel.topic}: unexpected encoding {channel.message_encoding}")

            if schema.name == "sensor_msgs/msg/JointState" and channel.topic != "/pi0d/command":
                out["joint_names"] = list(msg.name)
                stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
                if stamp <= last_measured:
                    out["measured_stamps_increasing"] = False
                last_measured = stamp
                assert len(msg.position) == len(msg.name)
                if values:
                    out["measured"].append(list(msg.position))
            elif channel.topic == "/pi0d/command":
                if message.log_time <= last_command:
                    out["command_log_times_increasing"] = False
                last_command = message.log_time
                for name, v in zip(msg.name, msg.velocity):
                    cur = out["command_max_abs_velocity"].get(name, 0.0)
                    out["command_max_abs_velocity"][name] = max(cur, abs(v))
            elif channel.topic == "/pi0d/chunks":
                dues = [s["due_ns"] for s in msg["steps"]]
                spacing = [(b - a) * 1e-9 for a, b in zip(dues, dues[1:])]
                out["chunks"].append(
                    {
                        "seq": msg["seq"],
                        "steps": len(msg["steps"]),
                        "width": len(msg["steps"][0]["position"]),
                        "first_due_is_observation": dues[0] == msg["observation_ns"],
                        "min_spacing_s": min(spacing),
                        "max_spacing_s": max(spacing),
                        "period_s": msg["period_s"],
                    }
                )
                if values:
                    out["chunks"][-1]["observation_ns"] = msg["observation_ns"]
                    out["chunks"][-1]["positions"] = [s["position"] for s in msg["steps"]]
                    out["chunks"][-1]["model"] = msg.get("model")
            elif channel.topic == "/pi0d/events":
                out["events"].append(msg)
            elif schema.name == "sensor_msgs/msg/CompressedImage":
                img = Image.open(io.BytesIO(bytes(msg.data)))
                out["frames"].append(
                    {"topic": channel.topic, "format": msg.format, "size": list(img.size), "bytes": len(msg.data),
                     "stamp_s": msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9}
                )
            elif channel.topic == "/diagnostics":
                out["diagnostics"].append([s.name for s in msg.status])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], "--values" in sys.argv[2:])
