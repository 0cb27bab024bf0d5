//! What loading a checkpoint holds in memory: the text embedding (2.1 GB in f32 for a full-size
//! pi0) is read a row at a time from the mapped file, and the load's own check of it hands its
//! pages back as it goes, so the load's peak is not the table's size. Judged on the process's
//! high-water mark (`ru_maxrss`), against a 1 GiB table.

use crate::common;

use std::process::{Command, Stdio};

use common::{big_embedding, scratch_dir, sim_model_config};

/// Runs `cmd` to its end: its exit code and its peak resident memory (bytes).
#[allow(clippy::zombie_processes)] // wait4 reaps it, with its resource usage.
fn peak_of(mut cmd: Command) -> (Option<i32>, u64) {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for the child this test started.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4");
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    // Linux reports kilobytes.
    (code, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn when_a_checkpoint_with_a_1_gib_embedding_loads_expect_the_peak_far_below_the_table() {
    let model = big_embedding("load-peak");
    let mut cfg = sim_model_config();
    cfg["policy"]["checkpoint"] = toml::Value::String(model.display().to_string());
    let dir = scratch_dir("load-peak-config");
    let config = dir.join("config.toml");
    std::fs::write(&config, toml::to_string(&cfg).unwrap()).unwrap();
    let mut check = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    check.arg("check").arg("--config").arg(&config);
    let (code, peak) = peak_of(check);
    assert_eq!(
        code,
        Some(0),
        "pi0d check failed on the big-embedding checkpoint"
    );
    // The table is 1 GiB; the model around it takes a few MB. Holding the table whole while
    // checking it (as a load once did) peaks above 1 GiB.
    assert!(
        peak < 256 << 20,
        "peak RSS {} MB while loading a checkpoint with a 1 GiB embedding",
        peak >> 20
    );
}
