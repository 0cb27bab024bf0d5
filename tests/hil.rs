//! Hardware in the loop: the real `pi0d` binary driving a MuJoCo robot over real DDS
//! (tests/hil/robot.py: urdf/sim_arm.urdf in MuJoCo, a rendered camera, the controllers'
//! topics, its own 100 ms driver watchdog), config/hil.toml with the bundled tiny pi0. Each
//! scenario checks what the robot saw and prints its figures (reaction times, rates, jerk).

mod common;

use std::path::Path;
use std::time::Duration;

use common::hil::*;
use common::*;
use toml::Value;

/// What a scenario run by `scenario` left: the robot's report and pi0d's summary.
struct Seen {
    robot: serde_json::Value,
    summary: serde_json::Value,
    /// The configuration pi0d ran.
    cfg: toml::Table,
}

/// The robot for `robot_s` seconds (with `args`), pi0d started once it is ready on config/hil.toml
/// as `edit` changes it, for `pi0d_s` seconds; both must end well.
fn scenario(
    name: &str,
    offset: u32,
    robot_s: f64,
    args: &[&str],
    edit: impl FnOnce(&mut toml::Table),
    pi0d_s: f64,
) -> Seen {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dom = domain(offset);
    let dir = scratch_dir(name);
    let bot = robot(dom, &dir, robot_s, args);
    let mut cfg = hil_config(dom);
    edit(&mut cfg);
    let out = pi0d(&dir, &cfg, pi0d_s).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let robot = report(&dir, bot);
    assert_robot_sane(&robot);
    Seen {
        robot,
        summary: summary(&dir),
        cfg,
    }
}

/// The scripted policy (a known smooth motion, 80 ms per chunk) instead of the tiny pi0: for
/// the scenarios about pi0d's watchdogs, whose timing must not hang on inference speed.
fn scripted(cfg: &mut toml::Table) {
    let p = cfg["policy"].as_table_mut().unwrap();
    for key in ["checkpoint", "threads", "seed"] {
        p.remove(key);
    }
    p.insert("kind".into(), Value::String("scripted".into()));
    p.insert("amplitude".into(), Value::Float(0.3));
    p.insert("frequency_hz".into(), Value::Float(0.2));
    p.insert("latency_s".into(), Value::Float(0.08));
}

/// `[policy.fault]`: `count` faulty chunks (0: all) of `kind` after `after` good ones.
fn with_fault(kind: &str, after: i64, count: i64, latency_s: f64) -> impl FnOnce(&mut toml::Table) {
    let kind = kind.to_string();
    move |cfg| {
        cfg["policy"].as_table_mut().unwrap().insert(
            "fault".into(),
            table(&[
                ("kind", Value::String(kind)),
                ("after_chunks", Value::Integer(after)),
                ("count", Value::Integer(count)),
                ("latency_s", Value::Float(latency_s)),
            ]),
        );
    }
}

/// The states the summary's transitions went to, in order.
fn states(summary: &serde_json::Value) -> Vec<String> {
    summary["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap().to_string())
        .collect()
}

/// `hold` was entered, and `running` came after it.
fn assert_held_then_resumed(summary: &serde_json::Value, hold: &str) {
    let states = states(summary);
    let i = states
        .iter()
        .position(|t| t == hold)
        .unwrap_or_else(|| panic!("no {hold}: {states:?}"));
    assert!(
        states[i + 1..].iter().any(|t| t == "running"),
        "never resumed: {states:?}"
    );
}

fn watchdog_holds(report: &serde_json::Value) -> Vec<f64> {
    report["watchdog_holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_f64().unwrap())
        .collect()
}

/// The robot's watchdog holds from `event` on, each with the setpoint's travel after the last
/// command before it (rad). Before the event pi0d must have kept commanding: no gap between its
/// trajectories' write stamps as long as the robot's watchdog (pi0d's own timeline; a hold the
/// robot's loop made by falling behind on a busy host is printed, as its figure).
fn watchdog_holds_after(report: &serde_json::Value, event: f64) -> Vec<Hold> {
    let travel = report["travel_after_last_command"].as_array().unwrap();
    assert_eq!(
        travel.len(),
        report["watchdog_holds"].as_array().unwrap().len()
    );
    let holds: Vec<Hold> = watchdog_holds(report)
        .into_iter()
        // null: no arm command was tracked before that hold (NaN fails every travel bound).
        .zip(travel.iter().map(|t| t.as_f64().unwrap_or(f64::NAN)))
        .enumerate()
        .map(|(index, (at, travel))| Hold { at, travel, index })
        .collect();
    let gaps: Vec<(f64, f64)> = report["write_gaps_over_watchdog"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g[0].as_f64().unwrap(), g[1].as_f64().unwrap()))
        .filter(|g| g.0 < event)
        .collect();
    assert!(
        gaps.is_empty(),
        "pi0d stopped writing for longer than the robot's watchdog before the event at {event}: {gaps:?}"
    );
    let before = holds.iter().filter(|h| h.at < event).count();
    if before > 0 {
        println!(
            "the robot's own loop (up to {:.0} ms late) held {before} time(s) before the event while pi0d's writes never paused past its watchdog",
            report["max_late_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
    holds.into_iter().filter(|h| h.at >= event).collect()
}

/// One of the robot's watchdog holds: when (the robot's wall s), the setpoint's travel after the
/// last command before it (rad), and its place in the report's lists.
#[derive(Debug)]
struct Hold {
    at: f64,
    travel: f64,
    index: usize,
}

/// How long pi0d may take to be moving the arm after it starts: the configuration's
/// `control.start_timeout_s` (pi0d gives up by then; 30 s by default) plus one chunk horizon.
fn start_deadline_s(cfg: &toml::Table) -> f64 {
    let start = cfg
        .get("control")
        .and_then(|c| c.get("start_timeout_s"))
        .and_then(|t| t.as_float())
        .unwrap_or(30.0);
    let p = &cfg["policy"];
    let horizon =
        p["chunk_steps"].as_integer().unwrap() as f64 * p["step_period_s"].as_float().unwrap();
    start + horizon
}

/// After pi0d ended: lets the robot run ten of its watchdog periods more (to see its hold),
/// then ends it (SIGTERM: it writes its report) and reads the report.
fn end_robot(dir: &Path, bot: std::process::Child) -> serde_json::Value {
    std::thread::sleep(Duration::from_millis(10 * ROBOT_WATCHDOG_MS));
    // SAFETY: a signal to a child this test started.
    unsafe { libc::kill(bot.id() as libc::pid_t, libc::SIGTERM) };
    report(dir, bot)
}

/// tests/hil/robot.py's `--watchdog-ms` default.
const ROBOT_WATCHDOG_MS: u64 = 100;

/// When the setpoint (what the robot's controller executes) came to rest after `after` (wall
/// seconds): the first 20 ms sample from which it stays below 1e-3 rad/s for half a second.
fn held_at(report: &serde_json::Value, after: f64) -> Option<f64> {
    let samples: Vec<(f64, f64)> = report["motion"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m[0].as_f64().unwrap(), m[1].as_f64().unwrap()))
        .filter(|(t, _)| *t >= after)
        .collect();
    (0..samples.len()).map(|i| samples[i].0).find(|&t0| {
        let window: Vec<_> = samples
            .iter()
            .filter(|(t, _)| *t >= t0 && *t < t0 + 0.5)
            .collect();
        window.len() >= 20 && window.iter().all(|(_, s)| *s < 1e-3)
    })
}

#[test]
fn when_pi0d_drives_the_mujoco_robot_then_gets_sigterm_expect_it_held_exit_0_then_the_driver_holds()
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dom = domain(1);
    let dir = scratch_dir("hil-nominal");
    // The camera at 30 Hz, as a robot's camera driver streams (the other scenarios render
    // 10 Hz, all this model needs, to leave the 2-core VM's time to pi0d and the physics).
    // The robot until the test ends it (after pi0d's exit and the robot's own hold).
    let mut bot = robot(dom, &dir, 120.0, &["--camera", "160x120@30"]);
    // The camera through image_transport's compressed topic (JPEG); the other scenarios take
    // the raw one.
    let mut cfg = hil_config(dom);
    cfg["ros"]["cameras"]["front"] = Value::String("/camera/image_raw/compressed".into());
    // Recorded, every frame too, to read back what a ROS run looks like in the file.
    cfg.insert(
        "record".into(),
        table(&[
            (
                "path",
                Value::String(format!("{}/", dir.join("rec").display())),
            ),
            ("camera_hz", Value::Integer(60)),
        ]),
    );
    let mut run = pi0d(&dir, &cfg, 60.0);
    wait_until_moving(&dir, &mut run, &mut bot, start_deadline_s(&cfg));
    // Driving for a while (the scenario's length, not a wait for start-up), then SIGTERM, as
    // systemd stops a service: decelerate, hold, exit 0.
    std::thread::sleep(Duration::from_millis(4000));
    let terminated = wall_now();
    stop(&run);
    let out = run.wait_with_output().unwrap();
    let ended = wall_now();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r = end_robot(&dir, bot);
    assert_robot_sane(&r);
    let s = summary(&dir);
    assert!(s["chunks_accepted"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["limit_violations"], 0, "{s}");
    // The camera the robot rendered reached the model (a stale camera would have held it).
    assert!(
        !s["transitions"].to_string().contains("stale_camera"),
        "{}",
        s["transitions"]
    );
    assert_eq!(s["exit"], "clean", "{s}");
    // pi0d ended at rest; the driver's watchdog then held the arm 100 ms after the last
    // command.
    let holds = watchdog_holds_after(&r, terminated);
    assert_eq!(holds.len(), 1, "{holds:?}");
    // The stream's end, judged on pi0d's own write stamps: the hold followed pi0d's last
    // command (nothing came after it) by the robot's watchdog, and pi0d wrote it before it
    // exited.
    let last = assert_held_by_the_watchdog(&r, holds[0].index);
    assert_eq!(Some(last), r["last_write"].as_f64(), "{holds:?}");
    assert!(
        last <= ended,
        "pi0d wrote at {last}, after it exited at {ended}"
    );
    println!(
        "hil SIGTERM: pi0d's last command {:.0} ms after the signal, the robot's watchdog hold {:.0} ms after it",
        (last - terminated) * 1e3,
        (holds[0].at - last) * 1e3
    );
    // The frames the robot published reached pi0d: judged frame by frame on the capture
    // stamps (the recording holds every frame pi0d received, camera_hz 60 >= 30), against the
    // frames the robot published between pi0d's first and last one. The rates are figures: a
    // host that takes the cores away slows the software renderer itself.
    let (camera_hz, stamps) = assert_recording_of_the_robot(&s);
    let rendered_hz = r["camera_rate_hz"].as_f64().unwrap();
    let published: Vec<f64> = r["camera_stamps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f[0].as_f64().unwrap())
        .filter(|t| *t >= stamps[0] - 1e-4 && *t <= stamps[stamps.len() - 1] + 1e-4)
        .collect();
    assert!(!published.is_empty(), "the robot reported no camera stamps");
    let unknown: Vec<&f64> = stamps
        .iter()
        // pi0d records a frame with the stamp it came with, to the nanosecond (one wall-clock
        // offset for the whole process); both sides make seconds of it alike. 1 us: a float's
        // resolution at today's Unix time is a quarter of that.
        .filter(|t| !published.iter().any(|p| (*p - **t).abs() < 1e-6))
        .collect();
    assert!(
        unknown.is_empty(),
        "frames the robot never published: {unknown:?}"
    );
    // Each frame recorded once, in the order published. How many of the published frames
    // pi0d took is the host's (a best-effort keep-last-1 camera drops the frame a busy reader
    // did not take before the next): a figure.
    assert!(
        stamps.windows(2).all(|w| w[1] > w[0]),
        "frames recorded twice or out of order: {stamps:?}"
    );
    println!(
        "hil nominal: pi0d received {} of the {} frames the robot published meanwhile",
        stamps.len(),
        published.len()
    );
    let jerk = max_over_joints(&r["max_setpoint_jerk"]);
    println!(
        "hil nominal + SIGTERM: robot at {:.0} Hz (largest gap {:.1} ms), camera at {camera_hz:.1} Hz (rendered at {rendered_hz:.1}), {} commands, {} chunks accepted, latency p50 {} ms, setpoint jerk max {jerk:.1}, measured jerk max {:.1}",
        r["joint_state_rate_hz"].as_f64().unwrap(),
        r["joint_state_gap_max_ms"].as_f64().unwrap(),
        r["commands"],
        s["chunks_accepted"],
        s["latency_ms"]["p50"],
        max_over_joints(&r["max_measured_jerk"]),
    );
}

/// The run's MCAP file, read back with Python's mcap readers: the robot's joint-state topic,
/// one command per tick, the rendered frames at the camera's size, diagnostics.
fn assert_recording_of_the_robot(s: &serde_json::Value) -> (f64, Vec<f64>) {
    let rec = &s["recording"];
    assert_eq!(rec["ended_by"], "run_end", "{rec}");
    assert_eq!(rec["dropped"], 0, "{rec}");
    let back = mcap_read_back(Path::new(rec["path"].as_str().unwrap()));
    let count = |t: &str| back["topics"][t]["count"].as_u64().unwrap_or(0);
    assert_eq!(count("/pi0d/command"), s["ticks"].as_u64().unwrap());
    assert!(count("/joint_states") > 500, "{}", back["topics"]);
    assert!(count("/diagnostics") >= 3, "{}", back["topics"]);
    let frames = back["frames"].as_array().unwrap();
    assert!(frames.len() >= 10, "{} frames", frames.len());
    assert!(frames
        .iter()
        .all(|f| f["size"] == serde_json::json!([160, 120])));
    // The camera's rate as pi0d received it: frames between the first and the last capture.
    let stamps: Vec<f64> = frames
        .iter()
        .map(|f| f["stamp_s"].as_f64().unwrap())
        .collect();
    let span = stamps.last().unwrap() - stamps[0];
    ((stamps.len() - 1) as f64 / span, stamps)
}

#[test]
fn when_pi0d_is_killed_mid_motion_expect_the_robot_to_hold_on_its_own_watchdog() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dom = domain(2);
    let dir = scratch_dir("hil-kill");
    let mut bot = robot(dom, &dir, 120.0, &[]);
    let cfg = hil_config(dom);
    let mut run = pi0d(&dir, &cfg, 60.0);
    // Mid-motion: once the arm moves, and a second of driving after.
    wait_until_moving(&dir, &mut run, &mut bot, start_deadline_s(&cfg));
    std::thread::sleep(Duration::from_millis(1000));
    let killed = wall_now();
    run.kill().unwrap();
    let _ = run.wait();
    let dead = wall_now();
    let r = end_robot(&dir, bot);
    assert_robot_sane(&r);
    let holds = watchdog_holds_after(&r, killed);
    assert_eq!(holds.len(), 1, "{holds:?}");
    let Hold { at, travel, index } = holds[0];
    let reaction = at - killed;
    // The robot held on its own watchdog (the configured time after the last command, on its
    // step clock), after the last command pi0d ever wrote, which it wrote before it died.
    let last = assert_held_by_the_watchdog(&r, index);
    assert_eq!(Some(last), r["last_write"].as_f64(), "{holds:?}");
    assert!(
        last <= dead,
        "pi0d wrote at {last}, after it was reaped at {dead}"
    );
    // Between the last command and the hold the controller ran the last trajectory's tail, which
    // ends at rest a short coast ahead.
    assert!(
        travel < 0.05,
        "the arm travelled {travel} after the last command"
    );
    println!(
        "hil kill -9: the robot's watchdog held the arm {:.0} ms after the kill (watchdog 100 ms), {travel:.4} rad of travel after the last command",
        reaction * 1e3
    );
}

#[test]
fn when_the_estop_is_pressed_expect_rest_latched_until_a_reset_then_a_fresh_chunk() {
    // The scripted policy (80 ms per chunk), moving at up to 0.4 rad/s when pressed.
    let args = ["--estop-at", "3.0", "--reset-at", "5.0"];
    let seen = scenario("hil-estop", 3, 9.5, &args, scripted, 8.5);
    let (r, s) = (&seen.robot, &seen.summary);
    let pressed = r["estop_at"].as_f64().expect("the e-stop was pressed");
    let reset = r["reset_at"].as_f64().expect("the reset was sent");
    let held = held_at(r, pressed).expect("the arm came to rest");
    let reaction = held - pressed;
    // On pi0d's own stamps: its first command at rest after the press as the robot published
    // it, within what the configuration allows: the next control tick, the stop under the
    // configured limits from the speed pi0d commanded, and the transit allowance.
    let published = r["estop_written"].as_f64().expect("the press was written");
    let rest = rest_written_at(r, published, 0.5).expect("pi0d never commanded rest");
    let bound =
        control_period_s(&seen.cfg) + braking_bound_s(&seen.cfg, s) + transit_allowance_s(r);
    assert!(
        rest - published <= bound,
        "pi0d's first command at rest {:.3} s after the press; the configuration allows {bound:.3} s",
        rest - published
    );
    // Latched: at rest from then until the reset, the button released 0.2 s before it.
    let motion: Vec<(f64, f64)> = r["motion"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m[0].as_f64().unwrap(), m[1].as_f64().unwrap()))
        .collect();
    let moved_while_latched = motion
        .iter()
        .filter(|(t, v)| *t > held && *t < reset && *v > 1e-3)
        .count();
    assert_eq!(moved_while_latched, 0, "the arm moved while e-stopped");
    // The reset resumes nothing by itself: a chunk from an observation after it (80 ms of
    // inference at least) moves the arm again.
    let resumed = motion
        .iter()
        .find(|(t, v)| *t > reset && *v > 1e-3)
        .map(|(t, _)| t - reset)
        .expect("the arm never moved after the reset");
    assert!(
        resumed >= 0.06,
        "the arm moved {resumed:.3} s after the reset: sooner than a fresh chunk"
    );
    let states = states(s);
    let latched = states
        .iter()
        .position(|t| t == "estopped")
        .expect("no estopped");
    let after = &states[latched..];
    let i = after
        .iter()
        .position(|t| t == "holding(after_reset)")
        .unwrap_or_else(|| panic!("no reset: {states:?}"));
    assert!(after[i..].iter().any(|t| t == "running"), "{states:?}");
    println!(
        "hil e-stop: pi0d commanded rest {:.0} ms after the press (allowed {:.0} ms), the robot's setpoint at rest {:.0} ms after it, held until the reset, moving again {:.0} ms after it (a fresh chunk); setpoint jerk max {:.1}",
        (rest - published) * 1e3,
        bound * 1e3,
        reaction * 1e3,
        resumed * 1e3,
        max_over_joints(&r["max_setpoint_jerk"])
    );
}

/// A stalled input at the robot (`args`: `--stall-joint-states` or `--stall-camera`, from
/// 3.5 s for 1.5 s): pi0d holds (the summary names the watchdog), its first command at rest
/// (its own stamp) comes within what the configuration allows after the stall began (the
/// input's `safety.<timeout>`, its publishing period `period_s`, a control tick, the stop
/// under the limits, the transit allowance), and the arm runs again after it. Returns the
/// summary.
fn stalled_input_holds(
    name: &str,
    args: &[&str],
    edit: impl FnOnce(&mut toml::Table),
    input: &str,
    hold: &str,
    (timeout, period_s): (&str, f64),
    offset: u32,
) -> serde_json::Value {
    let both = |cfg: &mut toml::Table| {
        scripted(cfg);
        edit(cfg);
    };
    let seen = scenario(name, offset, 9.5, args, both, 8.5);
    let r = &seen.robot;
    assert_held_then_resumed(&seen.summary, hold);
    let stalled = r["stalled_at"][input].as_f64().expect("the stall happened");
    let held = held_at(r, stalled).expect("the arm came to rest");
    let reaction = held - stalled;
    let cfg = &seen.cfg;
    let timeout_s = cfg["safety"][timeout]
        .as_float()
        .unwrap_or_else(|| panic!("safety.{timeout}"));
    let bound = timeout_s
        + period_s
        + control_period_s(cfg)
        + braking_bound_s(cfg, &seen.summary)
        + transit_allowance_s(r);
    let rest = rest_written_at(r, stalled, 0.5).expect("pi0d never commanded rest");
    assert!(
        rest - stalled <= bound,
        "pi0d's first command at rest {:.3} s after the {input} stalled; the configuration allows {bound:.3} s",
        rest - stalled
    );
    println!(
        "hil {input} stall: pi0d commanded rest {:.0} ms after the stall began (allowed {:.0} ms), the robot's setpoint at rest {:.0} ms after it ({hold}), then running again; setpoint jerk max {:.1}",
        (rest - stalled) * 1e3,
        bound * 1e3,
        reaction * 1e3,
        max_over_joints(&r["max_setpoint_jerk"])
    );
    seen.summary
}

#[test]
fn when_the_robots_joint_states_stall_expect_a_hold_at_the_robot_within_the_timeout_then_a_resume()
{
    // safety.joint_state_timeout_s = 0.1, then the deceleration.
    stalled_input_holds(
        "hil-js-stall",
        &["--stall-joint-states", "3.5,1.5"],
        |_| {},
        "joint_states",
        "holding(stale_joint_state)",
        // The robot publishes its joint states every other 2 ms physics step.
        ("joint_state_timeout_s", 0.004),
        4,
    );
}

#[test]
fn when_one_of_two_cameras_stalls_expect_a_hold_naming_it_within_the_timeout_then_a_resume() {
    // Two cameras at the robot, both watched by pi0d; only the wrist camera stalls, the front
    // one goes on. safety.camera_timeout_s = 0.5, then the deceleration.
    let wrist = "/wrist_camera/image_raw";
    let two = |cfg: &mut toml::Table| {
        cfg["ros"]["cameras"]
            .as_table_mut()
            .unwrap()
            .insert("wrist".into(), Value::String(wrist.into()));
    };
    let s = stalled_input_holds(
        "hil-camera-stall",
        &[
            "--cameras",
            "front,wrist",
            "--stall-camera",
            "3.5,1.5,wrist",
        ],
        two,
        "camera",
        "holding(stale_camera)",
        // The robot's cameras run at 10 Hz.
        ("camera_timeout_s", 0.1),
        5,
    );
    let named: Vec<&str> = s["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["to"] == "holding(stale_camera)")
        .map(|t| t["camera"].as_str().unwrap_or("(none)"))
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|c| c.contains(wrist)),
        "the stale-camera holds named {named:?}, not {wrist}"
    );
}

#[test]
fn when_the_policy_starts_emitting_nan_expect_none_at_the_robot_and_the_arm_held() {
    let seen = scenario("hil-nan", 6, 8.5, &[], with_fault("nan", 3, 0, 0.0), 7.5);
    let (r, s) = (&seen.robot, &seen.summary);
    // Nothing non-finite ever reached the robot (`assert_robot_sane`), and it held.
    let nan = s["chunks_rejected_by_reason"]["non_finite"]
        .as_u64()
        .unwrap_or(0);
    assert!(nan >= 3, "{s}");
    assert!(
        states(s).iter().any(|t| t == "holding(chunk_starved)"),
        "{:?}",
        states(s)
    );
    println!(
        "hil NaN policy: {nan} chunks refused, none reached the robot ({} commands, all finite); setpoint jerk max {:.1}",
        r["commands"],
        max_over_joints(&r["max_setpoint_jerk"])
    );
}

#[test]
fn when_inference_is_slower_than_the_chunk_horizon_expect_the_robot_held_then_moving_again() {
    let slow = with_fault("slow", 3, 2, 1.5);
    let edit = |cfg: &mut toml::Table| {
        scripted(cfg);
        slow(cfg);
    };
    let seen = scenario("hil-slow", 7, 10.5, &[], edit, 9.5);
    let r = &seen.robot;
    assert_held_then_resumed(&seen.summary, "holding(chunk_starved)");
    // At the robot: moving, then a span at rest, then moving again.
    let first = r["motion"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m[1].as_f64().unwrap() > 1e-3)
        .and_then(|m| m[0].as_f64())
        .expect("the arm moved");
    let held = held_at(r, first).expect("the arm held while starved");
    let moved_after = r["motion"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m[0].as_f64().unwrap() > held + 0.5 && m[1].as_f64().unwrap() > 1e-3);
    assert!(moved_after, "the arm never moved again after the hold");
    println!(
        "hil slow inference: held at the robot {:.1} s after it first moved, then moving again; setpoint jerk max {:.1}",
        held - first,
        max_over_joints(&r["max_setpoint_jerk"])
    );
}

/// What a drill run left: the robot's report, pi0d's exit code, stderr and summary, the
/// notifications with their times, and when the drill fired (READY + its `at_s`).
struct Drilled {
    robot: serde_json::Value,
    code: Option<i32>,
    stderr: String,
    summary: serde_json::Value,
    notes: Vec<(f64, String)>,
    drill_at: f64,
}

/// The scripted policy under systemd's notify protocol (watchdog 200 ms: pings every 100 ms)
/// with the drill `event` `at_s` after READY (lasting `duration_s`), on the robot for 8 s.
fn drilled(name: &str, offset: u32, event: &str, at_s: f64, duration_s: Option<f64>) -> Drilled {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dom = domain(offset);
    let dir = scratch_dir(name);
    let bot = robot(dom, &dir, 8.0, &[]);
    let mut cfg = hil_config(dom);
    scripted(&mut cfg);
    add_drill(&mut cfg, event, at_s, duration_s);
    let socket = NotifySocket::open(&dir);
    let env = [
        ("NOTIFY_SOCKET", socket.path.display().to_string()),
        ("WATCHDOG_USEC", "200000".to_string()),
    ];
    let out = pi0d_with_env(&dir, &cfg, 30.0, &env)
        .wait_with_output()
        .unwrap();
    let notes = socket.messages();
    let ready = notified(&notes, "READY=1").expect("READY=1 was sent");
    let robot = report(&dir, bot);
    assert_robot_sane(&robot);
    Drilled {
        robot,
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        summary: summary(&dir),
        notes,
        drill_at: ready + at_s,
    }
}

/// The robot's driver watchdog held the arm once after the drill, because pi0d's command
/// stream ended: the configured watchdog after the last command on the robot's step clock, and
/// that command was the last pi0d wrote (its own stamp). Returns the reaction to the drill as
/// the test timed it (s, a figure: READY's arrival here plus `at_s`), pi0d's last write after
/// the drill (s, a figure) and the travel after the last command (rad).
fn held_by_the_robot(d: &Drilled) -> (f64, f64, f64) {
    let holds = watchdog_holds_after(&d.robot, d.drill_at);
    assert_eq!(holds.len(), 1, "{holds:?}");
    let Hold { at, travel, index } = holds[0];
    let last = assert_held_by_the_watchdog(&d.robot, index);
    assert_eq!(Some(last), d.robot["last_write"].as_f64(), "{holds:?}");
    assert!(travel < 0.05, "{travel} rad after the last command");
    (at - d.drill_at, last - d.drill_at, travel)
}

#[test]
fn when_the_control_loop_freezes_expect_the_watchdog_pings_to_stop_and_the_robot_to_hold() {
    let d = drilled("hil-freeze", 8, "stall_control", 3.0, Some(30.0));
    // No controlled stop is possible: exit 6 at once (not after the 30 s stall).
    assert_eq!(d.code, Some(6), "{}", d.stderr);
    assert!(
        d.stderr.contains("control thread stopped ticking"),
        "{}",
        d.stderr
    );
    let pings = notified_at(&d.notes, "WATCHDOG=1");
    let before = pings.iter().filter(|t| **t < d.drill_at).count();
    assert!(
        before >= 20,
        "{before} pings before the freeze: {:?}",
        d.notes
    );
    // The last ping within one ping period (100 ms) of the freeze, plus the supervisor's poll.
    let last = pings.last().copied().unwrap() - d.drill_at;
    assert!(last < 0.2, "pings went on {last:.3} s after the freeze");
    let (reaction, written, travel) = held_by_the_robot(&d);
    println!(
        "hil frozen control loop: the last systemd watchdog ping {:.0} ms after the freeze ({before} before it, one per 100 ms); pi0d's last command {:.0} ms after it, the robot's watchdog held {:.0} ms after it, {travel:.4} rad of travel after the last command; exit 6",
        last * 1e3,
        written * 1e3,
        reaction * 1e3
    );
}

#[test]
fn when_the_ros_thread_dies_expect_a_fault_stop_exit_7_and_the_robot_held() {
    let d = drilled("hil-ros-death", 9, "crash_io", 3.0, None);
    assert_eq!(d.code, Some(7), "{}", d.stderr);
    assert!(
        d.stderr.contains("ROS thread panicked") && d.stderr.contains("crash_io"),
        "{}",
        d.stderr
    );
    assert_eq!(d.summary["exit"], "thread_fault", "{}", d.summary);
    // A thread fault stops the watchdog pings too: systemd sees it even before the exit.
    let last_ping = notified_at(&d.notes, "WATCHDOG=1")
        .last()
        .copied()
        .unwrap_or(0.0);
    assert!(last_ping - d.drill_at < 0.2, "{}", last_ping - d.drill_at);
    // No command can reach the robot any more: its own watchdog holds the arm.
    let (reaction, written, travel) = held_by_the_robot(&d);
    let ended = notified(&d.notes, "STOPPING=1").map(|t| t - d.drill_at);
    println!(
        "hil ROS thread death: fault stop (exit 7); pi0d's last command {:.0} ms after it, the robot's watchdog held {:.0} ms after it, {travel:.4} rad of travel after the last command; STOPPING {:?} s after it",
        written * 1e3,
        reaction * 1e3,
        ended
    );
}
