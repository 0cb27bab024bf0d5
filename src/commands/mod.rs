//! The binary's commands besides the daemon (`run` in main.rs): one module each.

pub mod check;
pub mod export;
pub mod infer;
pub mod plot;
pub mod quantize;
pub mod serve;

#[cfg(test)]
mod cli_tests;
