"""A model of ros2_control's joint_trajectory_controller for pi0d's tests: its acceptance checks
and the way it samples what it accepted.

Written from ros2_controllers' sources (`joint_trajectory_controller.cpp`
`validate_trajectory_msg`, `joint_trajectory_controller_parameters.yaml`, `trajectory.cpp`
`interpolate_between_points`) on the humble and jazzy branches and the rolling master. It is a
model of the controller's checks with each distribution's default parameters, not the
controller: no ros2_control runs on these machines.
"""

import math

FLOAT_EPS = 1.1920928955078125e-07  # std::numeric_limits<float>::epsilon()

# Default parameters that decide acceptance, per distribution (a position-interface controller,
# so no effort command interface).
DEFAULTS = {
    "humble": {"allow_nonzero_velocity_at_trajectory_end": True, "allow_partial_joints_goal": False},
    "jazzy": {"allow_nonzero_velocity_at_trajectory_end": False, "allow_partial_joints_goal": False},
    "rolling": {"allow_nonzero_velocity_at_trajectory_end": False, "allow_partial_joints_goal": False},
}

# Where a new trajectory starts from (the "point before" the message's points):
# "measured": the hardware state at the update that installs it (humble and jazzy defaults: a
#   position and velocity, no acceleration interface), so that update repeats the state;
# "desired": the last commanded state at the previous update (jazzy's
#   interpolate_from_desired_state, humble's open_loop_control);
# "blend": the running trajectory sampled at the install time (rolling's default
#   allow_trajectory_replacement blend bridge).
START_FROM = {"humble": "measured", "jazzy": "measured", "rolling": "blend",
              "jazzy+interpolate_from_desired_state": "desired"}


def seconds(t):
    return t.sec + t.nanosec * 1e-9


def refusal(msg, joints, now_s, distro):
    """Why the controller (of `distro`, default parameters) refuses `msg`, or None."""
    p = DEFAULTS[distro]
    names = list(msg.joint_names)
    if not p["allow_partial_joints_goal"] and len(names) != len(joints):
        return "Joints on incoming trajectory don't match the controller joints."
    if not names:
        return "Empty joint names on incoming trajectory."
    if not msg.points:
        return "Empty trajectory received."
    for n in names:
        if n not in joints:
            return f"Incoming joint {n} doesn't match the controller's joints."
    if not p["allow_nonzero_velocity_at_trajectory_end"]:
        for n, v in zip(names, msg.points[-1].velocities):
            if abs(v) > FLOAT_EPS:
                return f"Velocity of last trajectory point of joint {n} is not zero: {v:.15f}"
    start = seconds(msg.header.stamp)
    if start != 0.0 and start + seconds(msg.points[-1].time_from_start) < now_s:
        return f"Received trajectory with non-zero start time ({start}) that ends in the past"
    previous = 0.0
    for i, pt in enumerate(msg.points):
        t = seconds(pt.time_from_start)
        if i > 0 and t <= previous:
            return f"Time between points {i - 1} and {i} is not strictly increasing"
        previous = t
        if len(pt.positions) != len(names):
            return f"Mismatch between joint_names and positions at point #{i}."
        for field in ("velocities", "accelerations"):
            values = getattr(pt, field)
            if len(values) and len(values) != len(names):
                return f"Mismatch between joint_names and {field} at point #{i}."
        if len(pt.effort):
            return "Trajectories with effort fields are only supported for the effort interface."
    return None


def spline(a, b, t_a, t_b, t, use_accel):
    """interpolate_between_points for one joint: linear, cubic or quintic by what both ends give;
    `a` and `b` are (p, v, acc) with None where a point leaves the field empty."""
    T = t_b - t_a
    s = min(max(t - t_a, 0.0), T)
    (p0, v0, a0), (p1, v1, a1) = a, b
    if v0 is None or v1 is None or T <= 0:
        k = (p1 - p0) / T if T > 0 else 0.0
        return p0 + k * s, k, 0.0
    if not use_accel or a0 is None or a1 is None:
        c2 = (-3 * p0 + 3 * p1 - 2 * v0 * T - v1 * T) / T**2
        c3 = (2 * p0 - 2 * p1 + v0 * T + v1 * T) / T**3
        return (p0 + v0 * s + c2 * s**2 + c3 * s**3, v0 + 2 * c2 * s + 3 * c3 * s**2, 2 * c2 + 6 * c3 * s)
    T2, T3, T4, T5 = T**2, T**3, T**4, T**5
    c3 = (-20 * p0 + 20 * p1 - 3 * a0 * T2 + a1 * T2 - 12 * v0 * T - 8 * v1 * T) / (2 * T3)
    c4 = (30 * p0 - 30 * p1 + 3 * a0 * T2 - 2 * a1 * T2 + 16 * v0 * T + 14 * v1 * T) / (2 * T4)
    c5 = (-12 * p0 + 12 * p1 - a0 * T2 + a1 * T2 - 6 * v0 * T - 6 * v1 * T) / (2 * T5)
    pos = p0 + v0 * s + a0 / 2 * s**2 + c3 * s**3 + c4 * s**4 + c5 * s**5
    vel = v0 + a0 * s + 3 * c3 * s**2 + 4 * c4 * s**3 + 5 * c5 * s**4
    acc = a0 + 6 * c3 * s + 12 * c4 * s**2 + 20 * c5 * s**3
    return pos, vel, acc


class Follower:
    """Replays accepted trajectories (arrival time, msg) as the controller's update loop would
    (`rate_hz`; each new message replaces the running one, from the point before it that
    `start_from` names) and measures the motion it commands, for a perfect arm (its measured
    state is the last commanded one)."""

    def __init__(self, start_from, rate_hz=500.0):
        self.start_from = start_from
        self.dt = 1.0 / rate_hz

    def run(self, received):
        if len(received) < 2:
            return None
        received = sorted(received, key=lambda r: r[0])
        n = len(received[0][1].joint_names)
        first = received[0][1].points[0]
        state = [(first.positions[j], 0.0, 0.0) for j in range(n)]
        traj, k = None, 0
        positions = []
        u, end = received[0][0], received[-1][0] + 0.5
        stopped_at = None
        while u < end:
            new = None
            while k < len(received) and received[k][0] <= u:
                new, k = received[k][1], k + 1
            if new is not None:
                if self.start_from == "measured":
                    before, t0 = [(p, v, None) for p, v, _ in state], u
                elif self.start_from == "desired":
                    before, t0 = list(state), u - self.dt
                else:
                    before = [self.sample(traj, j, u) for j in range(n)] if traj else list(state)
                    t0 = u
                # A zero stamp starts the trajectory now; another one is its start time (on the
                # same wall clock as the arrival times here).
                stamp = seconds(new.header.stamp)
                traj = (new, stamp if stamp != 0.0 else u, t0, before)
            state = [self.sample(traj, j, u) for j in range(n)]
            positions.append([s[0] for s in state])
            if stopped_at is None and k == len(received):
                stopped_at = len(positions)
            u += self.dt
        return self.measure(positions, stopped_at)

    @staticmethod
    def sample(traj, j, u):
        msg, start, t0, before = traj
        knots = [(t0, before[j])]
        for pt in msg.points:
            v = pt.velocities[j] if len(pt.velocities) else None
            a = pt.accelerations[j] if len(pt.accelerations) else None
            t = start + seconds(pt.time_from_start)
            if t <= knots[0][0]:
                # A point already past when installed (a stamp in the past): the controller
                # samples between the message's own points from there on.
                knots = [(t, (pt.positions[j], v, a))]
                continue
            knots.append((t, (pt.positions[j], v, a)))
        if u >= knots[-1][0]:
            p, v, a = knots[-1][1]
            return p, 0.0 if v is None else v, 0.0 if a is None else a
        for (ta, a), (tb, b) in zip(knots, knots[1:]):
            if u < tb:
                return spline(a, b, ta, tb, u, use_accel=True)
        raise AssertionError("unreachable")

    def measure(self, positions, stopped_at):
        dt = self.dt
        jerk = acc = 0.0
        acc_at = None
        for i in range(3, len(positions)):
            for j in range(len(positions[0])):
                p3, p2, p1, p0 = (positions[i - d][j] for d in range(4))
                jerk = max(jerk, abs(p3 - 3 * p2 + 3 * p1 - p0) / dt**3)
                a = abs(p2 - 2 * p1 + p0) / dt**2
                if a > acc:
                    acc, acc_at = a, i - 1
        # After the last message: how far the arm still travelled (a stream that stops must
        # not end in a halt at the last point, nor in a runaway).
        tail = None
        if stopped_at is not None and stopped_at < len(positions):
            tail = max(abs(positions[-1][j] - positions[stopped_at - 1][j]) for j in range(len(positions[0])))
        # Where the largest acceleration was (s after the first message), to find its cause.
        return {"max_jerk": jerk, "max_acceleration": acc, "travel_after_last": tail,
                "max_acceleration_at_s": None if acc_at is None else acc_at * dt,
                "samples": len(positions)}


def check_stream(received, joints, drop_every=None):
    """Per controller set-up (START_FROM): how many messages its distribution's defaults refuse
    (with the first reason) and the motion it makes of the accepted ones; `drop_every=k` loses
    every k-th message on the way."""
    out = {}
    for setup, start_from in START_FROM.items():
        distro = setup.split("+")[0]
        refused, first = 0, None
        accepted = []
        for i, (arrival, wall, msg) in enumerate(received):
            why = refusal(msg, joints, wall, distro)
            if why is not None:
                refused += 1
                first = first or why
            elif drop_every is None or (i + 1) % drop_every:
                accepted.append((arrival, msg))
        out[setup] = {"refused": refused, "first_refusal": first, "accepted": len(accepted),
                      "motion": Follower(start_from).run(accepted)}
    return out


def interarrival(arrivals):
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
    if not gaps:
        return None
    at = lambda q: gaps[round((len(gaps) - 1) * q)] * 1e3  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99), "max": gaps[-1] * 1e3, "n": len(gaps)}


assert math.isclose(spline((0, 0, 0), (1, 0, 0), 0, 1, 0.5, True)[0], 0.5)


class _Duration:
    """A builtin_interfaces/Duration stand-in for `seconds` (float seconds in `sec`)."""

    def __init__(self, s):
        self.sec, self.nanosec = s, 0


class _Point:
    def __init__(self, pt, t):
        self.positions, self.velocities = pt.positions, pt.velocities
        self.accelerations, self.effort = pt.accelerations, pt.effort
        self.time_from_start = _Duration(t)


class _Message:
    def __init__(self, msg, points):
        self.header, self.joint_names, self.points = msg.header, msg.joint_names, points


def on_ticks(written):
    """pi0d's stream (write time, wall, msg) as it would have gone out with every write on time:
    a deterministic function of what pi0d wrote, so a busy host cannot change the verdict.

    Each message's first point is its tick's command, due at write time + time_from_start (pi0d
    plans on the command's timeline, whatever the write delay); those dues step by whole control
    periods (the median step), so each message gets its tick index. Installed at its tick's due
    time minus the usual lead (the median first time_from_start), with its points moved by the
    lead its write lost, it is the message an on-time write would have carried. Ticks pi0d's
    loop skipped stay gaps, as the controller would see them."""
    rows = sorted(written, key=lambda r: r[0])
    if len(rows) < 2:
        return list(rows)
    first = [seconds(m.points[0].time_from_start) for _, _, m in rows]
    due = [w + f for (w, _, _), f in zip(rows, first)]
    steps = sorted(b - a for a, b in zip(due, due[1:]) if b > a)
    period = steps[len(steps) // 2] if steps else 0.0
    lead = sorted(first)[len(first) // 2]
    out = []
    for (w, wall, m), f, d in zip(rows, first, due):
        tick = round((d - due[0]) / period) if period > 0 else 0
        arrival = due[0] + tick * period - lead
        shift = lead - f
        points = [_Point(p, seconds(p.time_from_start) + shift) for p in m.points]
        out.append((arrival, wall, _Message(m, points)))
    return out
