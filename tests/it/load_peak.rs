//! What loading a checkpoint holds in memory: the text embedding (2.1 GB in f32 for a full-size
//! pi0) is read a row at a time from the mapped file, and the load's own check of it hands its
//! pages back as it goes, so the load's peak is not the table's size. Judged on the process's
//! high-water mark as `pi0d check` reports it (`VmHWM`), against a 1 GiB table.

use crate::common;

use std::process::{Command, Stdio};

use common::{big_embedding, scratch_dir, sim_model_config};

/// Runs `pi0d check` on `config`: its exit code and the peak resident memory it reports (bytes;
/// its own address space's high-water mark: a child's `ru_maxrss` would also hold the test
/// process's, whose address space the child shares until it execs).
fn check_peak(config: &std::path::Path) -> (Option<i32>, u64, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .arg("check")
        .arg("--config")
        .arg(config)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mb = text
        .lines()
        .find_map(|l| l.strip_prefix("memory: peak "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no peak memory line:\n{text}"));
    (out.status.code(), mb << 20, text)
}

#[test]
fn when_a_checkpoint_with_a_1_gib_embedding_loads_expect_the_peak_far_below_the_table() {
    let model = big_embedding("load-peak");
    let mut cfg = sim_model_config();
    cfg["policy"]["checkpoint"] = toml::Value::String(model.display().to_string());
    let dir = scratch_dir("load-peak-config");
    let config = dir.join("config.toml");
    std::fs::write(&config, toml::to_string(&cfg).unwrap()).unwrap();
    let (code, peak, text) = check_peak(&config);
    assert_eq!(
        code,
        Some(0),
        "pi0d check failed on the big-embedding checkpoint:\n{text}"
    );
    // The table is 1 GiB; the model around it takes a few MB. Holding the table whole while
    // checking it (as a load once did) peaks above 1 GiB.
    assert!(
        peak < 256 << 20,
        "peak RSS {} MB while loading a checkpoint with a 1 GiB embedding",
        peak >> 20
    );
}
