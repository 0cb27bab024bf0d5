//! The recording's schemas. The ROS 2 ones are the message definitions with their
//! dependencies appended, separated as rosbag2 separates them (`msg/` holds them as rosbags'
//! ROS 2 Jazzy type store generates them; the read-back test compares them with it).

/// `(schema name, ros2msg text)`.
pub(crate) const JOINT_STATE: (&str, &[u8]) = (
    "sensor_msgs/msg/JointState",
    include_bytes!("msg/JointState.msg"),
);
pub(crate) const COMPRESSED_IMAGE: (&str, &[u8]) = (
    "sensor_msgs/msg/CompressedImage",
    include_bytes!("msg/CompressedImage.msg"),
);
pub(crate) const DIAGNOSTIC_ARRAY: (&str, &[u8]) = (
    "diagnostic_msgs/msg/DiagnosticArray",
    include_bytes!("msg/DiagnosticArray.msg"),
);

/// `/pi0d/chunks`: one record per chunk the worker handed to the control thread.
pub(crate) const CHUNK_JSON: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "pi0d.Chunk",
  "description": "An action chunk in robot joint order: each step with the time it is due (Unix ns)",
  "type": "object",
  "required": ["seq", "observation_ns", "period_s", "joints", "steps"],
  "properties": {
    "seq": {"type": "integer", "description": "inference sequence number"},
    "observation_ns": {"type": "integer", "description": "capture time of the observation it was computed from"},
    "period_s": {"type": "number"},
    "joints": {"type": "array", "items": {"type": "string"}},
    "model": {
      "type": "object",
      "description": "a model that runs here: its own output, before the checkpoint's postprocessor (normalized, the model's action order), the observation's state its relative actions were made absolute against (null for absolute actions), and for a model trained for real-time chunking the steps conditioned on the running chunk's leftover (null otherwise)",
      "required": ["actions", "reference_state"],
      "properties": {
        "actions": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "reference_state": {"type": ["array", "null"], "items": {"type": "number"}},
        "conditioned_delay": {"type": ["integer", "null"]}
      }
    },
    "steps": {
      "type": "array",
      "items": {
        "type": "object",
        "required": ["due_ns", "position", "velocity"],
        "properties": {
          "due_ns": {"type": "integer"},
          "position": {"type": "array", "items": {"type": "number"}},
          "velocity": {"type": "array", "items": {"type": "number"}}
        }
      }
    }
  }
}"#;

/// `/pi0d/events`: transitions, safety events and chunk outcomes.
pub(crate) const EVENT_JSON: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "pi0d.Event",
  "description": "A state transition, a safety event, a chunk accepted or found late by the control loop, a chunk refused before it (policy failure or validation), or a refused reset",
  "type": "object",
  "required": ["kind"],
  "properties": {
    "kind": {"enum": ["transition", "safety_event", "chunk_accepted", "chunk_late", "chunk_refused", "reset_refused"]},
    "from": {"type": "string"},
    "to": {"type": "string"},
    "mode": {"type": "string"},
    "safety_event": {"type": ["string", "null"]},
    "event": {"type": "string"},
    "new": {"type": "integer"},
    "total": {"type": "integer"},
    "seq": {"type": "integer"},
    "latency_s": {"type": "number"},
    "blend_correction": {"type": ["number", "null"]},
    "reason": {"type": "string"},
    "detail": {"type": "string"}
  }
}"#;
