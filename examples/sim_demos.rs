//! Writes scripted demonstrations of a configuration's simulator task (`[sim.task]`), one
//! safetensors file per episode, for `tools/sim_task.py` to turn into a lerobot dataset:
//! `cargo run --release --example sim_demos -- CONFIG EPISODES SEED OUT_DIR [EPISODE_S]`.

use std::path::PathBuf;

use anyhow::Context;
use pi0d::config::Config;
use pi0d::sim::{write_demonstrations, DemoOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, episodes, seed, out, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: sim_demos CONFIG EPISODES SEED OUT_DIR [EPISODE_S]");
    };
    let cfg = Config::load(&PathBuf::from(config))?;
    let opts = DemoOptions {
        episodes: episodes.parse().context("EPISODES: expected a count")?,
        seed: seed.parse().context("SEED: expected an integer")?,
        episode_s: match rest.first() {
            Some(s) => s.parse().context("EPISODE_S: expected seconds")?,
            None => 3.0,
        },
    };
    let report = write_demonstrations(&cfg, opts, &PathBuf::from(out))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
