//! The in-process and short-run integration tests, in one test binary: each file here used to
//! be its own binary, and every binary compiles its own copy of `common` and links the whole
//! library again (tens of MB and seconds each, twice with clippy). Files that need a binary of
//! their own stay in tests/: a global allocator (pi0_no_alloc), process-wide
//! environment changes (openpi_client), ROS domains or ports picked per process, long
//! timing-sensitive daemon runs.
//!
//! Tests are named `<file>::<test>`: `cargo test --test it config_validation::` runs one file.

#[path = "../common/mod.rs"]
mod common;

mod acl_backend;
mod calibration_files;
mod check_output;
mod config_files;
mod config_fuzz;
mod config_validation;
mod docs;
mod fault_latch;
mod first_run;
mod fuzz;
mod journald;
mod layouts;
mod load_peak;
mod outside_text;
mod package;
mod pi0_golden;
mod policy_inputs;
mod quantized;
mod ready_configs;
mod record_mcap;
mod relative_actions;
mod reload;
mod ros_args;
mod systemd_install;
mod systemd_notify;
mod trained_rtc;
