//! The closed-loop task of the hardware-in-the-loop suite: move the gripper above the red cube,
//! wherever it lies. models/hil-above-cube is a small pi0 trained from scratch with lerobot's own
//! training code on scripted demonstrations in the MuJoCo scene (tools/hil_task.py); its
//! rollout.json holds lerobot's own synchronous rollout of it in the same scene (the reference).
//! Here the real `pi0d` binary runs the same placements closed loop: the robot
//! (tests/hil/robot.py) renders its camera and steps its physics in real time, pi0d infers,
//! executes and commands over Cyclone DDS, and each episode is judged as the rollout judges it.

mod common;

use common::hil::*;
use common::*;

/// Episodes run here: the reference's placements (each takes about 5 s: the robot's and pi0d's
/// start-up and the 3 s episode).
const EPISODES: usize = 20;

/// What one episode came to, at pi0d and in lerobot's rollout.
struct Episode {
    cube: (f64, f64),
    tool_y: f64,
    ok: bool,
    xy_error: f64,
    reference_ok: bool,
    reference_xy_error: f64,
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The rollout's criteria: the tool within `xy` of the cube's centre across the table and between
/// `dz` above it. Returns (success, horizontal error).
fn judge(
    tool: &serde_json::Value,
    cube: &serde_json::Value,
    task: &serde_json::Value,
) -> (bool, f64) {
    let xy = (f(&tool[0]) - f(&cube[0])).hypot(f(&tool[1]) - f(&cube[1]));
    let dz = f(&tool[2]) - f(&cube[2]);
    let ok = xy < f(&task["success_xy_m"])
        && f(&task["success_dz_m"][0]) < dz
        && dz < f(&task["success_dz_m"][1]);
    (ok, xy)
}

#[test]
fn when_pi0d_runs_the_trained_task_closed_loop_over_dds_expect_the_tool_to_follow_the_cube_as_in_lerobots_rollout(
) {
    let checkpoint = root().join("models/hil-above-cube");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint.join("rollout.json")).unwrap())
            .unwrap();
    let task = &reference["task"];
    let episode_s = f(&task["episode_s"]).to_string();
    let placements = reference["results"].as_array().unwrap();
    assert!(
        placements.len() >= EPISODES,
        "{} placements",
        placements.len()
    );
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut episodes = Vec::new();
    for (i, r) in placements.iter().take(EPISODES).enumerate() {
        let dom = domain(i as u32);
        let dir = scratch_dir(&format!("hil-task-{i}"));
        let cube = (f(&r["cube"][0]), f(&r["cube"][1]));
        let at = format!("{},{}", cube.0, cube.1);
        let bot = robot(dom, &dir, 30.0, &["--cube", &at, "--episode-s", &episode_s]);
        let mut cfg = hil_config_from("hil_task.toml", dom);
        // tools/hil_quant.sh: the same placements with another checkpoint (a quantized copy of
        // the model), and each episode recorded (calibration input).
        if let Ok(other) = std::env::var("PI0D_HIL_CHECKPOINT") {
            cfg["policy"]["checkpoint"] = toml::Value::String(other);
        }
        if let Ok(record) = std::env::var("PI0D_HIL_RECORD") {
            cfg.insert(
                "record".into(),
                table(&[
                    ("path", toml::Value::String(format!("{record}/"))),
                    ("camera_hz", toml::Value::Float(10.0)),
                ]),
            );
        }
        assert_eq!(
            cfg["policy"]["prompt"].as_str(),
            task["prompt"].as_str(),
            "config/hil_task.toml's prompt is not the one the model was trained with"
        );
        let run = pi0d(&dir, &cfg, 60.0);
        // The robot ends the episode `episode_s` after the arm first moved.
        let seen = report(&dir, bot);
        stop(&run);
        let out = run.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "episode {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_robot_sane(&seen);
        assert_eq!(seen["episode_complete"], true, "episode {i}: {seen}");
        let s = summary(&dir);
        assert_eq!(s["limit_violations"], 0, "episode {i}: {s}");
        // The closed loop ran, on any host: the policy's chunks were accepted and none was
        // refused for what it held (a late one is the host's: a figure). Holds are figures too:
        // a starved chunk, and a stale camera when the robot's software renderer falls behind
        // on a busy host (the camera's path is judged by where the tool ends, below).
        assert!(
            s["chunks_accepted"].as_u64().unwrap() >= 1,
            "episode {i}: {s}"
        );
        for reason in ["non_finite", "shape", "policy_error", "policy_panic"] {
            let n = &s["chunks_rejected_by_reason"][reason];
            assert!(n.is_null() || n == 0, "episode {i}: {reason}: {s}");
        }
        let (ok, xy_error) = judge(&seen["tool_final"], &seen["cube_final"], task);
        let (reference_ok, reference_xy_error) = judge(&r["tool"], &r["cube_final"], task);
        assert_eq!(
            reference_ok,
            r["success"].as_bool().unwrap(),
            "the rollout's verdict of episode {i} does not follow its criteria"
        );
        println!(
            "hil task episode {i}: cube at ({:.3}, {:.3}): pi0d {} ({:.0} mm off; {} chunks, latency p50 {} ms, inference delay up to {} steps, {} starved, {} stale camera), lerobot {} ({:.0} mm off)",
            cube.0,
            cube.1,
            if ok { "success" } else { "miss" },
            xy_error * 1e3,
            s["chunks_accepted"],
            s["latency_ms"]["p50"],
            s["chunk_switches"]["delay_steps_max"],
            s["safety_events"]["chunk_starved"].as_u64().unwrap_or(0),
            s["safety_events"]["stale_camera"].as_u64().unwrap_or(0),
            if reference_ok { "success" } else { "miss" },
            reference_xy_error * 1e3,
        );
        episodes.push(Episode {
            cube,
            tool_y: f(&seen["tool_final"][1]),
            ok,
            xy_error,
            reference_ok,
            reference_xy_error,
        });
    }
    let wins = episodes.iter().filter(|e| e.ok).count();
    let reference_wins = episodes.iter().filter(|e| e.reference_ok).count();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let err = median(episodes.iter().map(|e| e.xy_error).collect());
    let reference_err = median(episodes.iter().map(|e| e.reference_xy_error).collect());
    println!(
        "hil task ({}): pi0d closed loop over DDS {wins}/{n} ({:.0} %, median {:.0} mm off), lerobot's synchronous rollout {reference_wins}/{n} ({:.0} %, median {:.0} mm off) on the same placements",
        std::env::var("PI0D_HIL_CHECKPOINT").unwrap_or_else(|_| "models/hil-above-cube".into()),
        100.0 * wins as f64 / EPISODES as f64,
        err * 1e3,
        100.0 * reference_wins as f64 / EPISODES as f64,
        reference_err * 1e3,
        n = EPISODES,
    );
    // The policy reads the cube's place from the camera alone: across the placements, where the
    // tool ends follows where the cube lies (lerobot's rollout: correlation 0.91 across the
    // table). A camera path that loses or garbles the image leaves the tool at one average place.
    let follow = correlation(
        &episodes.iter().map(|e| e.cube.1).collect::<Vec<_>>(),
        &episodes.iter().map(|e| e.tool_y).collect::<Vec<_>>(),
    );
    println!("hil task: the tool's final y follows the cube's with correlation {follow:.2}");
    assert!(
        follow > 0.6,
        "the tool does not follow the cube (correlation {follow:.2}): is the camera reaching the policy?"
    );
    // How many episodes pi0d solves, and how near the cube the tool ends, are figures (printed
    // above), not verdicts: whether each chunk is inferred before the running one ends depends
    // on how fast this host infers (the summary's inference delay and starved chunks, printed
    // per episode), and the policy is a noisy draw (today 3 to 7 of 20 against lerobot's 7 to 8;
    // see docs/contributing.md). What holds on any host is asserted above: every episode ran its length,
    // within the limits, no chunk refused for its content, and the tool's place follows the
    // cube's.
    let missed_by_pi0d_only: Vec<_> = episodes
        .iter()
        .filter(|e| e.reference_ok && !e.ok)
        .map(|e| e.cube)
        .collect();
    println!(
        "hil task: lerobot's rollout solved the cubes at {missed_by_pi0d_only:?}, pi0d did not"
    );
}

/// Pearson's correlation of two samples.
fn correlation(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}
