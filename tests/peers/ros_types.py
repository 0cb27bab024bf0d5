"""ROS 2 message types as Cyclone DDS IdlStructs, named as rmw_cyclonedds names them."""

from dataclasses import dataclass, field

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import float64, int32, sequence, uint8, uint32


@dataclass
class Time(IdlStruct, typename="builtin_interfaces.msg.dds_.Time_"):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Duration(IdlStruct, typename="builtin_interfaces.msg.dds_.Duration_"):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Header(IdlStruct, typename="std_msgs.msg.dds_.Header_"):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class JointState(IdlStruct, typename="sensor_msgs.msg.dds_.JointState_"):
    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)


@dataclass
class JointTrajectoryPoint(IdlStruct, typename="trajectory_msgs.msg.dds_.JointTrajectoryPoint_"):
    positions: sequence[float64] = field(default_factory=list)
    velocities: sequence[float64] = field(default_factory=list)
    accelerations: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)
    time_from_start: Duration = field(default_factory=Duration)


@dataclass
class JointTrajectory(IdlStruct, typename="trajectory_msgs.msg.dds_.JointTrajectory_"):
    header: Header = field(default_factory=Header)
    joint_names: sequence[str] = field(default_factory=list)
    points: sequence[JointTrajectoryPoint] = field(default_factory=list)


@dataclass
class Image(IdlStruct, typename="sensor_msgs.msg.dds_.Image_"):
    header: Header = field(default_factory=Header)
    height: uint32 = 0
    width: uint32 = 0
    encoding: str = ""
    is_bigendian: uint8 = 0
    step: uint32 = 0
    data: sequence[uint8] = field(default_factory=list)


@dataclass
class String(IdlStruct, typename="std_msgs.msg.dds_.String_"):
    data: str = ""


@dataclass
class Bool(IdlStruct, typename="std_msgs.msg.dds_.Bool_"):
    data: bool = False


@dataclass
class KeyValue(IdlStruct, typename="diagnostic_msgs.msg.dds_.KeyValue_"):
    key: str = ""
    value: str = ""


@dataclass
class DiagnosticStatus(IdlStruct, typename="diagnostic_msgs.msg.dds_.DiagnosticStatus_"):
    level: uint8 = 0
    name: str = ""
    message: str = ""
    hardware_id: str = ""
    values: sequence[KeyValue] = field(default_factory=list)


@dataclass
class DiagnosticArray(IdlStruct, typename="diagnostic_msgs.msg.dds_.DiagnosticArray_"):
    header: Header = field(default_factory=Header)
    status: sequence[DiagnosticStatus] = field(default_factory=list)


@dataclass
class CompressedImage(IdlStruct, typename="sensor_msgs.msg.dds_.CompressedImage_"):
    header: Header = field(default_factory=Header)
    format: str = ""
    data: sequence[uint8] = field(default_factory=list)


# std_srvs/Trigger as rmw_cyclonedds lays it on DDS: a request header (the client GUID's lower
# 8 bytes and the sequence number split high/low) precedes the message fields.
from cyclonedds.idl.types import array  # noqa: E402


@dataclass
class TriggerRequest(IdlStruct, typename="std_srvs.srv.dds_.Trigger_Request_"):
    guid: array[uint8, 8] = field(default_factory=lambda: [0] * 8)
    seq_high: int32 = 0
    seq_low: uint32 = 0
    structure_needs_at_least_one_member: uint8 = 0


@dataclass
class TriggerResponse(IdlStruct, typename="std_srvs.srv.dds_.Trigger_Response_"):
    guid: array[uint8, 8] = field(default_factory=lambda: [0] * 8)
    seq_high: int32 = 0
    seq_low: uint32 = 0
    success: bool = False
    message: str = ""


@dataclass
class MultiArrayDimension(IdlStruct, typename="std_msgs.msg.dds_.MultiArrayDimension_"):
    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
class MultiArrayLayout(IdlStruct, typename="std_msgs.msg.dds_.MultiArrayLayout_"):
    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
class Float64MultiArray(IdlStruct, typename="std_msgs.msg.dds_.Float64MultiArray_"):
    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


# control_msgs/action/GripperCommand's send_goal service as rmw_cyclonedds lays it on DDS
# (request header first, as for Trigger), served by gripper_action_controller.
@dataclass
class GripperCommandMsg(IdlStruct, typename="control_msgs.msg.dds_.GripperCommand_"):
    position: float64 = 0.0
    max_effort: float64 = 0.0


@dataclass
class GripperCommandGoal(IdlStruct, typename="control_msgs.action.dds_.GripperCommand_Goal_"):
    command: GripperCommandMsg = field(default_factory=GripperCommandMsg)


@dataclass
class GripperSendGoalRequest(IdlStruct, typename="control_msgs.action.dds_.GripperCommand_SendGoal_Request_"):
    guid: array[uint8, 8] = field(default_factory=lambda: [0] * 8)
    seq_high: int32 = 0
    seq_low: uint32 = 0
    goal_id: array[uint8, 16] = field(default_factory=lambda: [0] * 16)  # unique_identifier_msgs/UUID
    goal: GripperCommandGoal = field(default_factory=GripperCommandGoal)


@dataclass
class GripperSendGoalResponse(IdlStruct, typename="control_msgs.action.dds_.GripperCommand_SendGoal_Response_"):
    guid: array[uint8, 8] = field(default_factory=lambda: [0] * 8)
    seq_high: int32 = 0
    seq_low: uint32 = 0
    accepted: bool = False
    stamp: Time = field(default_factory=Time)
