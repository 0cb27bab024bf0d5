//! pi0.5's prompt with the state in it, as lerobot's
//! `pi05_prepare_state_tokenizer_processor_step` (and openpi's tokenizer) writes it.

/// pi0.5's state discretization: 256 bins over [-1, 1] (numpy `digitize(x, linspace(-1,1,257)[:-1]) - 1`).
pub(crate) fn discretize(x: f32) -> i32 {
    let x = x as f64;
    let below = (0..256)
        .filter(|i| -1.0 + 2.0 * *i as f64 / 256.0 <= x)
        .count() as i32;
    below - 1
}

/// pi0.5's prompt with the discretized, normalized state.
pub(crate) fn pi05_prompt(task: &str, normalized_state: &[f32]) -> String {
    let cleaned = task.trim().replace(['_', '\n'], " ");
    let state: Vec<String> = normalized_state
        .iter()
        .map(|x| discretize(*x).to_string())
        .collect();
    format!("Task: {cleaned}, State: {};\nAction: ", state.join(" "))
}
