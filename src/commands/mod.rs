//! The binary's commands besides the daemon (`run` in main.rs): one module each.

pub(crate) mod check;
pub(crate) mod export;
pub(crate) mod infer;
pub(crate) mod plot;
pub(crate) mod quantize;
pub(crate) mod serve;

#[cfg(test)]
mod cli_tests;
